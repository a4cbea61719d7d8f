//! Ctrl-C and SIGTERM for the programs that start GPU processes: the first one asks the running
//! companion to stop (see `crate::companion::INTERRUPTED`); the program then keeps what is
//! complete, removes what is partial, and exits with [`crate::status::Status::Interrupted`].

use crate::companion::INTERRUPTED;
use std::sync::atomic::Ordering;

/// Installs the handler (once per process; a second call is harmless).
pub fn stop_companions_on_interrupt() {
    let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
}
