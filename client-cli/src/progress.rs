//! The byte-progress bar every long transfer shows (sealing, downloading).

use indicatif::{ProgressBar, ProgressStyle};

pub fn bar(len: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(message.to_owned());
    bar
}
