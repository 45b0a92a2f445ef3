//! Cancel-on-drop: a request the engine holds is cancelled there unless it finished normally.

use std::sync::Arc;

use dolphin_engine::Engine;

/// Cancels `request_id` in the engine when dropped, unless disarmed.
pub struct CancelOnDrop {
    engine: Arc<dyn Engine>,
    request_id: String,
    armed: bool,
}

impl std::fmt::Debug for CancelOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelOnDrop")
            .field("request_id", &self.request_id)
            .field("armed", &self.armed)
            .finish()
    }
}

impl CancelOnDrop {
    /// Armed guard for a request the engine holds.
    pub fn new(engine: Arc<dyn Engine>, request_id: String) -> Self {
        Self {
            engine,
            request_id,
            armed: true,
        }
    }

    /// The request's id.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The request ended in the engine: nothing to cancel.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.engine.cancel(&self.request_id);
        }
    }
}
