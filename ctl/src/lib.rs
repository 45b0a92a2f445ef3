//! Dolphin operator CLI: local clusters, workers, tables, learning and replay.
