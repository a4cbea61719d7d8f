//! Progress bars, made in one place: hidden when the user asked for quiet or stderr is not a
//! terminal (a pipe, a CI log), so that no escape sequence ever lands in a file.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// A bar of `total` steps, or a hidden one.
pub fn bar(total: u64, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} points  {msg}  ETA {eta}")
            .expect("a valid template"),
    );
    bar
}
