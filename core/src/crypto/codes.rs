//! Arrives shortly.
