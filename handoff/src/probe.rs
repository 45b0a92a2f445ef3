//! Looking at one model's view of a sequence through driven sequences: the statistics of each
//! greedy step (what `dolphinctl handoff calibrate` sets thresholds from), and teacher-forced
//! agreement (at every position of a finished sequence, whether the model's greedy choice given
//! the same prefix is the token that is there).

use std::sync::Arc;

use dolphin_engine::{
    DriveStart, DrivenEnd, DrivenToken, Engine, EngineError, SeqDriver, SeqRequest, Steer,
    TokenStats,
};
use tokio::sync::mpsc;

/// What a probe's driver reports.
#[derive(Debug)]
enum Event {
    Token(u32, TokenStats),
    Mismatch(u32),
    End(DrivenEnd),
}

/// Keeps every token (`expected` empty), or keeps the tokens equal to `expected` and pauses on
/// the others so the caller appends the expected one.
#[derive(Debug)]
struct Probe {
    expected: Vec<u32>,
    prompt_len: usize,
    events: mpsc::UnboundedSender<Event>,
}

impl SeqDriver for Probe {
    fn on_token(&self, t: DrivenToken<'_>) -> Steer {
        let stats = t.stats.unwrap_or_default();
        let _ = self.events.send(Event::Token(t.token, stats));
        let i = t.tokens.len() - self.prompt_len;
        match self.expected.get(i) {
            Some(&want) if want != t.token => {
                let _ = self.events.send(Event::Mismatch(want));
                Steer::DropAndPause
            }
            _ => Steer::Keep,
        }
    }

    fn on_end(&self, end: DrivenEnd) {
        let _ = self.events.send(Event::End(end));
    }
}

fn greedy(request_id: &str, prompt: &[u32], max_tokens: u32) -> SeqRequest {
    let mut req = SeqRequest {
        request_id: request_id.into(),
        prompt: prompt.to_vec(),
        sampling: Default::default(),
    };
    req.sampling.max_tokens = max_tokens;
    req.sampling.ignore_eos = true;
    req
}

fn ended(end: DrivenEnd) -> Result<(), EngineError> {
    match end {
        DrivenEnd::Finished { .. } => Ok(()),
        DrivenEnd::Cancelled => Err(EngineError::Cancelled),
        DrivenEnd::Failed(msg) => Err(EngineError::InvalidRequest(msg)),
    }
}

/// Greedy-decodes `max_tokens` tokens after `prompt` on `engine`; returns each token with its
/// step's statistics.
pub async fn step_stats(
    engine: &Arc<dyn Engine>,
    request_id: &str,
    prompt: &[u32],
    max_tokens: u32,
) -> Result<Vec<(u32, TokenStats)>, EngineError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = Arc::new(Probe {
        expected: Vec::new(),
        prompt_len: prompt.len(),
        events: tx,
    });
    engine
        .drive(
            greedy(request_id, prompt, max_tokens),
            DriveStart::Active,
            driver,
        )
        .await?;
    let mut out = Vec::with_capacity(max_tokens as usize);
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token(t, s) => out.push((t, s)),
            Event::Mismatch(_) => {}
            Event::End(end) => return ended(end).map(|()| out),
        }
    }
    Err(EngineError::Shutdown)
}

/// For every token of `continuation` (generated after `prompt`): whether `engine`'s greedy
/// choice given the same prefix is that token. Teacher-forced through one driven sequence:
/// matching positions decode on, and at a mismatch the expected token is appended.
pub async fn agreement(
    engine: &Arc<dyn Engine>,
    request_id: &str,
    prompt: &[u32],
    continuation: &[u32],
) -> Result<Vec<bool>, EngineError> {
    if continuation.is_empty() {
        return Ok(Vec::new());
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = Arc::new(Probe {
        expected: continuation.to_vec(),
        prompt_len: prompt.len(),
        events: tx,
    });
    let n = continuation.len() as u32;
    let seq = engine
        .drive(greedy(request_id, prompt, n), DriveStart::Active, driver)
        .await?;
    let mut agree = Vec::with_capacity(continuation.len());
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token(t, _) => agree.push(t == continuation[agree.len()]),
            Event::Mismatch(want) => {
                if agree.len() == continuation.len() {
                    engine.cancel(request_id);
                    return Ok(agree);
                }
                engine.append(seq, &[want], true)?;
            }
            Event::End(end) => return ended(end).map(|()| agree),
        }
    }
    Err(EngineError::Shutdown)
}
