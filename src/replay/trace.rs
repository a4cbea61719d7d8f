//! A trace PyTorch's allocator recorded on a GPU (`torch.cuda.memory._record_memory_history`, as
//! `scripts/gpu/hf-run.py` writes it), read as untrusted input and replayed through the model:
//! the same allocations and frees in the same order, stage by stage. Where the model is exact,
//! the replay gives back the figures the GPU reported; the check of a recorded run says so.

use super::named::{NamedReplay, TensorId};
use crate::allocator::AllocatorConfig;
use crate::reading::Figures;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// One event of a recorded trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    /// A block of `bytes` (as asked for) handed out at `address`.
    Alloc { address: u64, bytes: u64 },
    /// The block at `address` returned to the allocator.
    Free { address: u64 },
    /// The allocator asked the driver for a new segment, placed at `address`: the replay places
    /// its next segment there, so that ties between equal-sized free blocks (ordered by address)
    /// resolve as on the GPU.
    Segment { address: u64 },
    /// An event the replay does not drive (a snapshot, a segment freed or mapped: the
    /// allocator's own consequences, which the model derives).
    Other,
}

/// A stage of the recorded run: its name and the events it spans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStage {
    pub name: String,
    pub begin: usize,
    pub end: usize,
}

/// A recorded trace and its stages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub events: Vec<TraceEvent>,
    pub stages: Vec<TraceStage>,
}

/// Why a recorded trace was refused: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TraceError {
    pub field: String,
    pub message: String,
}

fn refused(field: impl Into<String>, message: impl Into<String>) -> TraceError {
    TraceError {
        field: field.into(),
        message: message.into(),
    }
}

/// The most events a trace may hold (the GPU scripts record at most 4 000 000).
pub const MAX_EVENTS: usize = 4_000_000;

impl Trace {
    /// Reads `trace.events` (`[action, address, size, stream, ...]`) and `markers`
    /// (`[stage, "begin" | "end", event index]`) of a run record. Every event's action is known,
    /// every free frees a live block, every stage begins before it ends, within the trace.
    pub fn from_record(record: &serde_json::Value) -> Result<Trace, TraceError> {
        let events = record
            .pointer("/trace/events")
            .and_then(|e| e.as_array())
            .ok_or_else(|| refused("trace.events", "missing, or not a list"))?;
        if events.len() > MAX_EVENTS {
            return Err(refused(
                "trace.events",
                format!("{} events, more than {MAX_EVENTS}", events.len()),
            ));
        }
        let mut parsed = Vec::with_capacity(events.len());
        let mut live: HashMap<u64, u64> = HashMap::new();
        for (i, e) in events.iter().enumerate() {
            let field = || format!("trace.events[{i}]");
            let row = e
                .as_array()
                .filter(|r| r.len() >= 4)
                .ok_or_else(|| refused(field(), "not [action, address, size, stream, ...]"))?;
            let number = |k: usize, what: &str| {
                row[k]
                    .as_u64()
                    .ok_or_else(|| refused(field(), format!("{what} is not a whole number")))
            };
            let address = number(1, "the address")?;
            let bytes = number(2, "the size")?;
            number(3, "the stream")?;
            let event = match row[0].as_str() {
                Some("alloc") => {
                    if bytes == 0 || live.insert(address, bytes).is_some() {
                        return Err(refused(
                            field(),
                            "an allocation of 0 bytes, or at an address already live",
                        ));
                    }
                    TraceEvent::Alloc { address, bytes }
                }
                Some("free_completed") => {
                    if live.remove(&address).is_none() {
                        return Err(refused(field(), "frees an address that is not live"));
                    }
                    TraceEvent::Free { address }
                }
                Some("segment_alloc") => TraceEvent::Segment { address },
                Some(
                    "free_requested" | "snapshot" | "segment_free" | "segment_map"
                    | "segment_unmap" | "oom",
                ) => TraceEvent::Other,
                _ => return Err(refused(field(), "unknown action")),
            };
            parsed.push(event);
        }
        let stages = stages_of(record, parsed.len())?;
        Ok(Trace {
            events: parsed,
            stages,
        })
    }

    /// Replays the trace through a fresh allocator under `config`, after `before` (allocations
    /// made and freed before the trace began, such as the tensor that starts CUDA). Returns the
    /// figures of every stage, as the GPU script read them (peaks reset at the stage's start).
    pub fn replay(&self, config: AllocatorConfig, before: &[u64]) -> Vec<(String, Figures)> {
        let mut replay = NamedReplay::new(config);
        for &bytes in before {
            if let Ok(Some(id)) = replay.alloc("before the trace", bytes) {
                replay.free(id);
            }
        }
        let mut live: HashMap<u64, TensorId> = HashMap::new();
        let mut figures = Vec::with_capacity(self.stages.len());
        let mut stages = self.stages.iter().peekable();
        let mut open: Option<&TraceStage> = None;
        for (i, event) in self.events.iter().enumerate() {
            if open.is_some_and(|s| s.end == i) {
                figures.push((
                    open.take().expect("open").name.clone(),
                    replay.span_figures(),
                ));
            }
            if open.is_none() && stages.peek().is_some_and(|s| s.begin == i) {
                open = stages.next();
                replay.begin_span();
            }
            match *event {
                TraceEvent::Alloc { address, bytes } => {
                    if let Ok(Some(id)) = replay.alloc("traced", bytes) {
                        live.insert(address, id);
                    }
                }
                TraceEvent::Free { address } => {
                    if let Some(id) = live.remove(&address) {
                        replay.free(id);
                    }
                }
                TraceEvent::Segment { address } => replay.set_next_segment_address(address),
                TraceEvent::Other => {}
            }
        }
        if let Some(s) = open {
            figures.push((s.name.clone(), replay.span_figures()));
        }
        figures
    }
}

/// The stages of `markers`, in order, none overlapping, each within `events`.
fn stages_of(record: &serde_json::Value, events: usize) -> Result<Vec<TraceStage>, TraceError> {
    let markers = record
        .get("markers")
        .and_then(|m| m.as_array())
        .ok_or_else(|| refused("markers", "missing, or not a list"))?;
    let mut stages: Vec<TraceStage> = Vec::new();
    let mut open: Option<(String, usize)> = None;
    for (i, m) in markers.iter().enumerate() {
        let field = || format!("markers[{i}]");
        let (name, side, at) = match m.as_array().map(Vec::as_slice) {
            Some([n, s, a]) => (n.as_str(), s.as_str(), a.as_u64()),
            _ => (None, None, None),
        };
        let (Some(name), Some(side), Some(at)) = (name, side, at) else {
            return Err(refused(
                field(),
                "not [stage, \"begin\" | \"end\", event index]",
            ));
        };
        let at = usize::try_from(at)
            .ok()
            .filter(|&a| a <= events)
            .ok_or_else(|| refused(field(), format!("index {at} beyond the {events} events")))?;
        match (side, open.take()) {
            ("begin", None) => {
                if stages.last().is_some_and(|s| s.end > at) {
                    return Err(refused(field(), "begins before the previous stage ended"));
                }
                open = Some((name.to_string(), at));
            }
            ("end", Some((begun, begin))) if begun == name && begin <= at => {
                stages.push(TraceStage {
                    name: begun,
                    begin,
                    end: at,
                });
            }
            _ => return Err(refused(field(), "a stage must begin, then end, in order")),
        }
    }
    if let Some((name, _)) = open {
        return Err(refused("markers", format!("stage `{name}` never ends")));
    }
    Ok(stages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(events: serde_json::Value, markers: serde_json::Value) -> serde_json::Value {
        json!({"trace": {"events": events}, "markers": markers})
    }

    #[test]
    fn a_replayed_trace_gives_each_stage_its_figures() {
        let r = record(
            json!([
                ["snapshot", 0, 0, 0],
                ["alloc", 4096, 3_000_000, 0],
                ["alloc", 8192, 1000, 0],
                ["free_requested", 4096, 3_000_000, 0],
                ["free_completed", 4096, 3_000_000, 0],
                ["snapshot", 0, 0, 0],
                ["alloc", 4096, 20_000_000, 0],
                ["snapshot", 0, 0, 0]
            ]),
            json!([
                ["a", "begin", 0],
                ["a", "end", 5],
                ["b", "begin", 5],
                ["b", "end", 7]
            ]),
        );
        let trace = Trace::from_record(&r).unwrap();
        let figures = trace.replay(AllocatorConfig::default(), &[]);
        assert_eq!(figures.len(), 2);
        let (a, b) = (&figures[0].1, &figures[1].1);
        // 3 MB (3 000 320 rounded to 512) in a 20 MiB segment, 1000 B (1024) in a 2 MiB small
        // segment.
        assert_eq!(a.peak_allocated_bytes, 3_000_320 + 1024);
        assert_eq!(a.peak_reserved_bytes, (20 << 20) + (2 << 20));
        assert_eq!(a.allocated_end_bytes, 1024);
        // 20 MB takes the cached 20 MiB block whole: what would remain (under 1 MiB) is not
        // split off, so `allocated` counts the block, and no segment is added.
        assert_eq!(b.allocated_end_bytes, 1024 + (20 << 20));
        assert_eq!(b.peak_reserved_bytes, (20 << 20) + (2 << 20));
    }

    #[test]
    fn malformed_traces_are_refused_naming_the_field() {
        let cases = [
            (record(json!("x"), json!([])), "trace.events"),
            (
                record(json!([["alloc", 1, 0, 0]]), json!([])),
                "trace.events[0]",
            ),
            (
                record(json!([["free_completed", 1, 8, 0]]), json!([])),
                "trace.events[0]",
            ),
            (
                record(json!([["teleport", 1, 8, 0]]), json!([])),
                "trace.events[0]",
            ),
            (
                record(json!([["alloc", -1, 8, 0]]), json!([])),
                "trace.events[0]",
            ),
            (record(json!([]), json!([["a", "begin", 3]])), "markers[0]"),
            (record(json!([]), json!([["a", "end", 0]])), "markers[0]"),
            (record(json!([]), json!([["a", "begin", 0]])), "markers"),
        ];
        for (r, field) in cases {
            let e = Trace::from_record(&r).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }
}
