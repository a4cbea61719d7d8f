//! Ctrl-C and SIGTERM. Every program exits with [`crate::status::Status::Interrupted`] (130),
//! leaving no partial file (the temporary files being written are removed). A program that
//! starts GPU processes handles the interruption itself: the first signal stops the running
//! companions at once (see [`crate::companion::interrupt`]); the program then keeps what is
//! complete, removes what is partial, and exits 130.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the program ends an interruption itself (it runs companions).
static HANDLED_BY_THE_PROGRAM: AtomicBool = AtomicBool::new(false);

fn on_interrupt() {
    crate::companion::interrupt();
    if !HANDLED_BY_THE_PROGRAM.load(Ordering::SeqCst) {
        crate::files::remove_staged();
        std::process::exit(i32::from(crate::status::Status::Interrupted.code()));
    }
}

/// Installs the handler that ends the program at once with status 130 (once per process; a
/// second call is harmless).
pub fn exit_on_interrupt() {
    let _ = ctrlc::set_handler(on_interrupt);
}

/// From now on an interruption only stops the running companions: the program ends itself.
pub fn stop_companions_on_interrupt() {
    HANDLED_BY_THE_PROGRAM.store(true, Ordering::SeqCst);
    exit_on_interrupt();
}
