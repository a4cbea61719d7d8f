//! How the notebook shows the lesson: each step's figures (measured just now in a fresh process of
//! the GPU companion, or recorded on another machine and labelled so, with its environment) with
//! the allocator model's prediction under them, the allocator's map after a step, a summary like
//! `torch.cuda.memory_summary`, the chart of all steps, and the run with expandable segments beside
//! the default one. Every method returns HTML and never fails: a missing lesson says why, in the
//! words of [`crate::markup::labels`].

use super::record::{LessonRecord, StepRecord, ALLOC_CONF};
use super::script::LessonScript;
use super::{LessonModel, PREDICTED};
use crate::allocator::ComputeCapability;
use crate::allocator::{Pool, SegmentView};
use crate::markup::{labels, table, Html};
use crate::reading::{DeviceStats, StepReading};
use std::ops::RangeInclusive;
use std::path::PathBuf;

/// A lesson to show: measured just now, or read from a file recorded on another machine, or
/// neither (then why).
#[derive(Debug, Clone)]
pub struct ShownLesson {
    /// The lesson, when there is one to show.
    pub record: Option<LessonRecord>,
    /// The recorded file, when the lesson was not measured here.
    pub recorded: Option<PathBuf>,
    /// Why nothing was measured here, when nothing was.
    pub not_measured: Option<String>,
    /// Why there is no lesson to show, when there is none.
    pub missing: Option<String>,
    /// Whether this is the run with expandable segments.
    pub expandable: bool,
}

/// The lesson with PyTorch's default settings and the one with expandable segments.
#[derive(Debug, Clone)]
pub struct Lessons {
    pub default: ShownLesson,
    pub expandable: ShownLesson,
}

/// The architecture the notebook's prediction assumes when there is no record: the H200's.
const H200: ComputeCapability = ComputeCapability::new(9, 0);

fn note(text: &str) -> Html {
    Html::note(text)
}

fn bold_note(head: &str, text: &str) -> Html {
    Html(format!(
        "<p><b>{}</b> {}</p>",
        html_escape::encode_text(head),
        html_escape::encode_text(text)
    ))
}

/// 1-based step numbers as a 0-based index range, clamped to `len` entries (`None`: empty).
fn indices(range: &RangeInclusive<usize>, len: usize) -> Option<(usize, usize)> {
    let first = range.start().max(&1) - 1;
    let end = (*range.end()).min(len);
    (first < end).then_some((first, end))
}

impl ShownLesson {
    /// A lesson measured just now on this machine.
    pub fn measured(record: LessonRecord, expandable: bool) -> ShownLesson {
        ShownLesson {
            record: Some(record),
            recorded: None,
            not_measured: None,
            missing: None,
            expandable,
        }
    }

    /// The lesson recorded in `file` on another machine, shown because nothing was measured here
    /// (`why`); when the file cannot be read, nothing is shown and both reasons are said.
    pub fn recorded(file: PathBuf, why: String, expandable: bool) -> ShownLesson {
        use super::record::LessonFileError;
        use crate::files::ReadError;
        let (record, missing) = match LessonRecord::load(&file) {
            Ok(r) => (Some(r), None),
            Err(LessonFileError::Read(ReadError::Io { source, .. }))
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                (
                    None,
                    Some(format!(
                        "The lesson recorded elsewhere ({}) cannot be shown: it is missing, not \
                         recorded yet (scripts/gpu/lesson-proof.py records it on a GPU machine).",
                        file.display()
                    )),
                )
            }
            Err(e) => (
                None,
                Some(format!(
                    "The lesson recorded elsewhere ({}) cannot be shown: {e}.",
                    file.display()
                )),
            ),
        };
        ShownLesson {
            record,
            recorded: Some(file),
            not_measured: Some(why),
            missing,
            expandable,
        }
    }

    /// The line that says where the figures come from (it heads every table).
    pub fn source(&self) -> String {
        let settings = if self.expandable {
            format!("{ALLOC_CONF}=expandable_segments:True")
        } else {
            "default allocator settings".into()
        };
        match (&self.record, &self.recorded) {
            (Some(r), None) => format!(
                "MEASURED just now on this machine ({}, {settings}), in a fresh process of the \
                 GPU companion",
                r.gpu_name()
            ),
            (Some(r), Some(file)) => format!(
                "{} on {} ({settings}) at {}, not measured on this machine ({})",
                labels::RECORDED_ELSEWHERE,
                r.gpu_name(),
                r.recorded_at,
                file.file_name()
                    .map_or(file.display().to_string(), |n| n.to_string_lossy().into()),
            ),
            (None, _) => format!("no lesson ({settings})"),
        }
    }

    /// Why nothing is shown (no GPU here and no readable recording), as the notes every cell
    /// repeats; `None` when there is a lesson.
    fn absent(&self) -> Option<Html> {
        if self.record.is_some() {
            return None;
        }
        let mut h = Html(String::new());
        if let Some(why) = &self.not_measured {
            h = h.then(bold_note(labels::NO_GPU, why));
        }
        Some(h.then(note(self.missing.as_deref().unwrap_or("No lesson."))))
    }

    /// Where the figures come from, why nothing was measured here (when nothing was), the
    /// recorded environment and the allocator's settings.
    pub fn header(&self) -> Html {
        if let Some(h) = self.absent() {
            return h;
        }
        let r = self.record.as_ref().expect("a record");
        let mut h = bold_note(&self.source(), "");
        if let Some(why) = &self.not_measured {
            h = h.then(bold_note(labels::NO_GPU, why));
        }
        let s = &r.allocator_settings;
        h = h.then(note(&format!(
            "{ALLOC_CONF}: {}. The allocator reported: expandable segments {}, large segment \
             {} bytes, max_split_size {}, settings parsed: {}.",
            r.configuration_shown(),
            if s.expandable_segments { "on" } else { "off" },
            s.large_segment_size,
            s.max_split_size
                .map_or("unlimited".to_string(), |b| format!("{b} bytes")),
            if s.parsed.is_empty() {
                "none".to_string()
            } else {
                format!("`{}`", s.parsed)
            }
        )));
        h.then(r.environment.html())
    }

    /// The figures of steps `range` (numbered as in the tables, 1 = the start), each with the
    /// change from the step before, and the model's prediction of the same steps under them (or
    /// why there is none).
    pub fn steps(&self, range: RangeInclusive<usize>) -> Html {
        let Some(r) = &self.record else {
            let h = self.absent().unwrap_or(Html(String::new()));
            return h.then(self.prediction_without_record(|m| {
                match indices(&range, m.log.steps.len()) {
                    Some((first, end)) => m.log.rows(first, end),
                    None => note("(no predicted step in this range)"),
                }
            }));
        };
        let log = r.log(&self.source());
        let Some((first, end)) = indices(&range, log.steps.len()) else {
            return note(&format!(
                "This lesson has {} steps: none in {}..={}.",
                log.steps.len(),
                range.start(),
                range.end()
            ));
        };
        let h = log.rows(first, end);
        match r.model() {
            Ok(m) => h.then(m.log.rows(first, end.min(m.log.steps.len()))),
            Err(why) => h.then(note(&why)),
        }
    }

    /// Without a record: the model's prediction of the standard lesson's steps of fixed size on
    /// an H200, labelled as such.
    fn prediction_without_record(&self, show: impl FnOnce(&LessonModel) -> Html) -> Html {
        let Ok(mut m) = LessonModel::with_expandable_segments(H200, self.expandable) else {
            return Html(String::new());
        };
        for step in LessonScript::standard().steps {
            if step.is_relative() {
                break;
            }
            let label = step.label(None);
            if m.run(&step, None, &label).is_err() {
                break;
            }
        }
        note(
            "Nothing measured or recorded to show: below, the allocator model's prediction alone \
             for an H200, labelled as such (the last steps are sized from the free memory of the \
             GPU they run on, so the model cannot size them without a run).",
        )
        .then(show(&m))
    }

    /// The record of step `n` (numbered as in the tables), or why there is none.
    fn step(&self, n: usize) -> Result<(&LessonRecord, usize, &StepRecord), Html> {
        let r = self.record.as_ref().ok_or_else(|| note("No lesson."))?;
        match n
            .checked_sub(1)
            .and_then(|i| r.steps.get(i).map(|s| (i, s)))
        {
            Some((i, s)) => Ok((r, i, s)),
            None => Err(note(&format!(
                "This lesson has {} steps: there is no step {n}.",
                r.steps.len()
            ))),
        }
    }

    /// The allocator's map after step `n`: one bar per segment (for expandable segments, per
    /// contiguous mapped range), its blocks named, with the allocator's own counts; the predicted
    /// map under it.
    pub fn map(&self, n: usize) -> Html {
        if let Some(absent) = self.absent() {
            return absent.then(self.prediction_without_record(|m| {
                let i = n.wrapping_sub(1);
                match (m.maps.get(i), m.log.steps.get(i)) {
                    (Some(map), Some(reading)) => crate::plot::segment_map(
                        &format!("{PREDICTED}: the map after step {n} ({})", reading.step),
                        map,
                    )
                    .html(),
                    _ => note(&format!("(no predicted step {n})")),
                }
            }));
        }
        let (r, i, s) = match self.step(n) {
            Ok(found) => found,
            Err(h) => return h,
        };
        let mut h = map_html(
            &format!("The allocator's map after step {n}: {}", s.reading.step),
            &self.source(),
            &s.map,
            Some(&s.stats),
        );
        match r.model() {
            Ok(m) => {
                if let Some(map) = m.maps.get(i) {
                    h = h.then(
                        crate::plot::segment_map(
                            &format!("{PREDICTED}: the map after the same step"),
                            map,
                        )
                        .html(),
                    );
                }
            }
            Err(why) => h = h.then(note(&why)),
        }
        h
    }

    /// A summary of the allocator after step `n`, like `torch.cuda.memory_summary`: allocated,
    /// requested, reserved, non-releasable (inactive split) bytes and blocks, live blocks,
    /// segments, per pool from the map, with the retries and out-of-memory counters; the
    /// predicted summary under it.
    pub fn summary(&self, n: usize) -> Html {
        if let Some(absent) = self.absent() {
            return absent.then(self.prediction_without_record(|m| {
                let i = n.wrapping_sub(1);
                match (m.log.steps.get(i), m.stats.get(i), m.maps.get(i)) {
                    (Some(reading), Some(stats), Some(map)) => summary_table(
                        &format!(
                            "{} — allocator summary after step {n}",
                            m.log.source.clone().unwrap_or_default()
                        ),
                        reading,
                        stats,
                        map,
                    ),
                    _ => note(&format!("(no predicted step {n})")),
                }
            }));
        }
        let (r, i, s) = match self.step(n) {
            Ok(found) => found,
            Err(h) => return h,
        };
        let mut h = summary_table(
            &format!(
                "{} — allocator summary after step {n}: {}",
                self.source(),
                s.reading.step
            ),
            &s.reading,
            &s.stats,
            &s.map,
        );
        if r.allocator_settings.expandable_segments {
            h = h.then(note(EXPANDABLE_COUNTS));
        }
        match r.model() {
            Ok(m) => {
                if let (Some(reading), Some(stats), Some(map)) =
                    (m.log.steps.get(i), m.stats.get(i), m.maps.get(i))
                {
                    h = h.then(summary_table(
                        &format!(
                            "{} — allocator summary after the same step",
                            m.log.source.clone().unwrap_or_default()
                        ),
                        reading,
                        stats,
                        map,
                    ));
                }
            }
            Err(why) => h = h.then(note(&why)),
        }
        h
    }

    /// `allocated`, `reserved` and the GPU memory in use over every step, with how many steps the
    /// model predicted exactly.
    pub fn chart(&self) -> Html {
        let Some(r) = &self.record else {
            let h = self.absent().unwrap_or(Html(String::new()));
            return h.then(self.prediction_without_record(|m| m.log.chart()));
        };
        let verdict = match r.exact_steps() {
            Some((equal, of)) => format!(
                "The allocator model's prediction equals the measurement (allocated, reserved, \
                 both peaks, requested, segments and the statistics) at {equal} of {of} steps."
            ),
            None => r
                .why_not_predicted()
                .unwrap_or_else(|| r.model().err().unwrap_or_default()),
        };
        crate::plot::step_chart(&r.log(&self.source())).with_caption(&verdict)
    }
}

/// What the allocator does not count with expandable segments, and where PyTorch's source says so.
const EXPANDABLE_COUNTS: &str = "With expandable segments the allocator counts no segment \
    (map_block adds the pages it maps to reserved_bytes only) and no inactive split block \
    (free_block and alloc_found_block leave expandable segments out of inactive_split), in \
    c10/cuda/CUDACachingAllocator.cpp; the map's segments are its contiguous mapped ranges, as \
    snapshot() lists them.";

/// The map under `title`, with the allocator's own counts (when known) as its caption.
fn map_html(title: &str, source: &str, map: &[SegmentView], stats: Option<&DeviceStats>) -> Html {
    let counted = match stats {
        Some(s) => format!(
            "; the allocator counts {} segment(s), and {} bytes in {} free block(s) inside \
             segments that also hold live blocks (inactive split: empty_cache cannot return them)",
            s.segments, s.inactive_split_bytes, s.inactive_split_blocks
        ),
        None => String::new(),
    };
    crate::plot::segment_map(title, map).with_caption(&format!(
        "{source}: {} segment(s) in the map{counted}.",
        map.len()
    ))
}

/// Figures of one pool (or all) from the allocator's map.
#[derive(Default)]
struct PoolFigures {
    allocated: u64,
    requested: u64,
    reserved: u64,
    inactive_split: u64,
    live_blocks: u64,
    inactive_split_blocks: u64,
    segments: u64,
}

fn pool_figures(map: &[SegmentView], pool: Pool) -> PoolFigures {
    let mut f = PoolFigures::default();
    for s in map.iter().filter(|s| s.pool == pool) {
        f.segments += 1;
        f.reserved = f.reserved.saturating_add(s.size);
        for b in &s.blocks {
            if b.allocated {
                f.live_blocks += 1;
                f.allocated = f.allocated.saturating_add(b.size);
                f.requested = f.requested.saturating_add(b.requested_size);
            } else if b.inactive_split {
                f.inactive_split_blocks += 1;
                f.inactive_split = f.inactive_split.saturating_add(b.size);
            }
        }
    }
    f
}

/// The summary table of one step.
fn summary_table(caption: &str, r: &StepReading, s: &DeviceStats, map: &[SegmentView]) -> Html {
    let (large, small) = (
        pool_figures(map, Pool::Large),
        pool_figures(map, Pool::Small),
    );
    let n = |v: u64| v.to_string();
    let none = String::new;
    let row = |metric: &str, current: String, peak: String, l: String, sm: String| {
        vec![metric.to_string(), current, peak, l, sm]
    };
    let rows = vec![
        row(
            "allocated memory",
            n(r.allocated),
            n(r.peak_allocated),
            n(large.allocated),
            n(small.allocated),
        ),
        row(
            "requested memory",
            n(s.requested_bytes),
            none(),
            n(large.requested),
            n(small.requested),
        ),
        row(
            "GPU reserved memory",
            n(r.reserved),
            n(r.peak_reserved),
            n(large.reserved),
            n(small.reserved),
        ),
        row(
            "non-releasable memory (inactive split bytes)",
            n(s.inactive_split_bytes),
            none(),
            n(large.inactive_split),
            n(small.inactive_split),
        ),
        row(
            "non-releasable blocks (inactive split)",
            n(s.inactive_split_blocks),
            none(),
            n(large.inactive_split_blocks),
            n(small.inactive_split_blocks),
        ),
        row(
            "live blocks (allocations)",
            n(large.live_blocks + small.live_blocks),
            none(),
            n(large.live_blocks),
            n(small.live_blocks),
        ),
        row(
            "GPU reserved segments",
            n(s.segments),
            none(),
            n(large.segments),
            n(small.segments),
        ),
        row(
            "cudaMalloc retries (num_alloc_retries)",
            n(s.alloc_retries),
            none(),
            none(),
            none(),
        ),
        row(
            "out-of-memory errors (num_ooms)",
            n(s.ooms),
            none(),
            none(),
            none(),
        ),
    ];
    table(
        caption,
        &[
            "",
            "all pools, now (the allocator's counters)",
            "peak",
            "large pool (from the map)",
            "small pool (from the map)",
        ],
        &rows,
    )
}

impl Lessons {
    /// Where both lessons come from; the default one's environment.
    pub fn header(&self) -> Html {
        let expandable = match &self.expandable.record {
            Some(_) => bold_note(&self.expandable.source(), ""),
            None => self.expandable.absent().unwrap_or(Html(String::new())),
        };
        self.default
            .header()
            .then(note("And the same lesson with expandable segments:"))
            .then(expandable)
    }

    /// Steps `range` of the default lesson (see [`ShownLesson::steps`]).
    pub fn steps(&self, range: RangeInclusive<usize>) -> Html {
        self.default.steps(range)
    }

    /// The default lesson's map after step `n` (see [`ShownLesson::map`]).
    pub fn map(&self, n: usize) -> Html {
        self.default.map(n)
    }

    /// The default lesson's summary after step `n` (see [`ShownLesson::summary`]).
    pub fn summary(&self, n: usize) -> Html {
        self.default.summary(n)
    }

    /// The default lesson's chart (see [`ShownLesson::chart`]).
    pub fn chart(&self) -> Html {
        self.default.chart()
    }

    /// The two runs side by side: after every step, the counters of each (allocated, reserved,
    /// segments counted and in the map, inactive split bytes, retries), then both maps after step
    /// `n`. No prediction for the run with expandable segments: the model does not cover them.
    pub fn compare(&self, n: usize) -> Html {
        let (Some(d), Some(e)) = (&self.default.record, &self.expandable.record) else {
            let mut h = Html(String::new());
            for shown in [&self.default, &self.expandable] {
                if let Some(absent) = shown.absent() {
                    h = h.then(note(&shown.source())).then(absent);
                }
            }
            return h;
        };
        let cell = |s: Option<&StepRecord>, f: fn(&StepRecord) -> u64| {
            s.map_or("—".to_string(), |s| f(s).to_string())
        };
        let fields: [fn(&StepRecord) -> u64; 6] = [
            |s| s.reading.allocated,
            |s| s.reading.reserved,
            |s| s.stats.segments,
            |s| s.map.len() as u64,
            |s| s.stats.inactive_split_bytes,
            |s| s.stats.alloc_retries,
        ];
        let rows: Vec<Vec<String>> = (0..d.steps.len().max(e.steps.len()))
            .map(|i| {
                let (a, b) = (d.steps.get(i), e.steps.get(i));
                let title = a
                    .or(b)
                    .map(|s| s.step.as_ref().map_or("start".into(), |st| st.title()))
                    .unwrap_or_default();
                let mut row = vec![format!("{}. {title}", i + 1)];
                for f in fields {
                    row.push(cell(a, f));
                    row.push(cell(b, f));
                }
                row
            })
            .collect();
        let h = table(
            &format!(
                "After each step — default: {} | expandable: {}",
                self.default.source(),
                self.expandable.source()
            ),
            &[
                "step",
                "allocated (default)",
                "allocated (expandable)",
                "reserved (default)",
                "reserved (expandable)",
                "segments counted (default)",
                "segments counted (expandable)",
                "segments in the map (default)",
                "segments in the map (expandable)",
                "inactive split bytes (default)",
                "inactive split bytes (expandable)",
                "alloc retries (default)",
                "alloc retries (expandable)",
            ],
            &rows,
        );
        let maps = [(d, &self.default), (e, &self.expandable)].map(|(r, shown)| {
            match n.checked_sub(1).and_then(|i| r.steps.get(i)) {
                Some(s) => map_html(
                    &format!("After step {n}: {}", s.reading.step),
                    &shown.source(),
                    &s.map,
                    Some(&s.stats),
                ),
                None => note(&format!("{}: there is no step {n}.", shown.source())),
            }
        });
        let [dm, em] = maps;
        h.then(note(EXPANDABLE_COUNTS))
            .then(dm)
            .then(em)
            .then(note(&e.why_not_predicted().unwrap_or_else(|| {
                "(the expandable run reported default settings)".into()
            })))
    }

    pub fn evcxr_display(&self) {
        self.header().evcxr_display()
    }
}

impl ShownLesson {
    pub fn evcxr_display(&self) {
        self.header().evcxr_display()
    }
}
