//! The progress bar long runs show (`sim`, `mapbench`).

use ftlab_sim::sim::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A progress bar that appears only on a terminal and only once a run has taken a second.
pub struct ProgressView {
    started: Instant,
    bar: Option<ProgressBar>,
    phase: String,
    enabled: bool,
}

impl ProgressView {
    pub fn new(enabled: bool) -> Self {
        Self {
            started: Instant::now(),
            bar: None,
            phase: String::new(),
            enabled: enabled && std::io::stderr().is_terminal(),
        }
    }

    pub fn update(&mut self, p: Progress) {
        if !self.enabled || self.started.elapsed() < Duration::from_secs(1) {
            return;
        }
        if self.bar.is_none() || self.phase != p.phase {
            if let Some(b) = self.bar.take() {
                b.finish_and_clear();
            }
            let bar = match p.total {
                Some(t) => ProgressBar::with_draw_target(Some(t), ProgressDrawTarget::stderr())
                    .with_style(
                        ProgressStyle::with_template(
                            "{msg:32} [{bar:40}] {percent:>3}% {human_pos}/{human_len} eta {eta}",
                        )
                        .expect("valid template")
                        .progress_chars("=> "),
                    ),
                None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
                    .with_style(
                        ProgressStyle::with_template("{msg:32} {spinner} {human_pos} requests")
                            .expect("valid template"),
                    ),
            };
            bar.set_message(p.phase.to_string());
            self.phase = p.phase.to_string();
            self.bar = Some(bar);
        }
        if let Some(b) = &self.bar {
            b.set_position(p.done);
        }
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
