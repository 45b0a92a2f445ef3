//! Offline learning for DolphinRouting, from the router's request log (`--request-log`, one
//! JSON line per request):
//!
//! - [`classifier`]: the output-length classifier (class boundaries and representative lengths
//!   from the log's output lengths, multinomial logistic regression over the admission sketch),
//!   with held-out accuracy against the majority-class baseline;
//! - [`fit`]: a routing table's standardizer and clustering model ([`kmeans`] or a
//!   diagonal-covariance Gaussian mixture, [`gmm`]) with initial bits;
//! - [`search`]: learning the bits by measurement (per-cluster scan, then epsilon-greedy
//!   refinement) against an [`search::Evaluator`] that serves a period with given bits;
//! - [`measure`]: replayed requests (live or simulated) as log records and measured periods;
//! - [`sim_target`]: the simulator as a learning target.
//!
//! k-means++ and EM are written here rather than taken from linfa-clustering: they are about
//! 300 lines, while linfa brings ndarray and its own dependency tree to compile on a 2-core
//! build machine for the same few loops, and our models are 4-dimensional with a handful of
//! clusters. The router's crate defines the formats and the feature functions, so training and
//! serving cannot drift apart.

pub mod classifier;
pub mod error;
pub mod fit;
pub mod gmm;
pub mod kmeans;
pub mod load_rule;
pub mod log;
pub mod measure;
pub mod search;
pub mod sim_target;
pub mod stats;
pub mod synthetic;

pub use error::LearnError;
