//! Ctrl-C and SIGTERM for the programs that start GPU processes: the first one stops the running
//! companions at once (see [`crate::companion::interrupt`]); the program then keeps what is
//! complete, removes what is partial, and exits with [`crate::status::Status::Interrupted`].

/// Installs the handler (once per process; a second call is harmless).
pub fn stop_companions_on_interrupt() {
    let _ = ctrlc::set_handler(crate::companion::interrupt);
}
