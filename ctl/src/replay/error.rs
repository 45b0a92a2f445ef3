//! Why a replay could not run or report.

use std::path::PathBuf;

use dolphin_workload::WorkloadError;

use crate::chart::PlotError;
use crate::error::CtlError;

/// Everything `dolphinctl replay` (and the library drivers) can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The arguments do not fit together (e.g. a simulator flag with `--target live`).
    #[error("{0}")]
    Usage(String),
    /// The workload could not be named, read or generated.
    #[error("workload")]
    Workload(#[from] WorkloadError),
    /// The simulator's timing profile could not be loaded.
    #[error("--sim-profile {name:?}")]
    Profile {
        /// The name or path given.
        name: String,
        /// Why it failed.
        #[source]
        source: dolphin_engine::sim::ProfileError,
    },
    /// The routing table file could not be read.
    #[error("cannot read the routing table {}", path.display())]
    TableRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The routing table file is not a valid table.
    #[error("routing table {}", path.display())]
    Table {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: dolphin_router::dolphin::TableError,
    },
    /// The output classifier file could not be read or is not a classifier.
    #[error("output classifier {}: {detail}", path.display())]
    Classifier {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The simulator refused the cluster or a request.
    #[error("simulation failed")]
    Sim(#[from] dolphin_sim::SimError),
    /// The router could not be reached or refused ListModels.
    #[error(transparent)]
    Router(#[from] CtlError),
    /// The router serves no model (or not the one asked for).
    #[error("{0}")]
    Model(String),
    /// Every one of the first requests failed: the router is down or refuses everything.
    #[error(
        "the first {failed} requests all failed ({summary}); first error: {first}; is the router at {url} up and serving?"
    )]
    AllFailing {
        /// How many failed.
        failed: usize,
        /// Failures by status code ("Unavailable x 20").
        summary: String,
        /// The first failure's message.
        first: String,
        /// The router dialled.
        url: String,
    },
    /// A request task died (a bug in the driver).
    #[error("a request task failed: {0}")]
    Task(String),
    /// The JSON report or a chart's directory could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A chart could not be drawn.
    #[error("chart {name}")]
    Plot {
        /// The chart's file name.
        name: String,
        /// Why.
        #[source]
        source: PlotError,
    },
    /// Printing the report failed (closed pipe, full disk).
    #[error("cannot write output")]
    Output(#[source] std::io::Error),
}

impl ReplayError {
    /// The process exit code: 64 for bad usage or configuration, 1 for failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            ReplayError::Usage(_)
            | ReplayError::Workload(WorkloadError::Spec(_))
            | ReplayError::Profile { .. }
            | ReplayError::TableRead { .. }
            | ReplayError::Table { .. } => 64,
            ReplayError::Router(CtlError::InvalidUrl { .. }) => 64,
            _ => 1,
        }
    }
}
