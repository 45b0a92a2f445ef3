//! Dolphin decode worker: decodes requests, prefilling locally or through a prefill worker.
