//! A recorded run's allocator trace (`scripts/gpu/hf-record.py`) against the budget's emulation
//! of the same workload: the first event where the two sequences part, with the events around
//! it; then, stage by stage, the first allocation whose size differs (a stage compared on its
//! own, whatever came before). What the replay of a new workload is derived from.
//!
//!     cargo run --release --example compare-trace -- RECORD.json[.gz] [EVENTS_AROUND]
//!
//! (EVENTS_AROUND, 12 unless given, also widens the stages' windows)
//!
//! (the recorded traces are in `tests/fixtures/hf-traces/`).

use iteragpu_lab::replay::trace::{Trace, TraceEvent};
use iteragpu_lab::replay::{Device, Event, OutsideBytes};
use iteragpu_lab::stack::run::{program, Run};
use std::collections::HashMap;

/// An event written the same way for both sides: `+bytes` (allocation n) or `-n` (allocation n
/// freed); the trace's other events are empty strings.
fn recorded(trace: &Trace) -> Vec<String> {
    let mut live: HashMap<u64, usize> = HashMap::new();
    let mut n = 0;
    let mut out = Vec::new();
    for e in &trace.events {
        match *e {
            TraceEvent::Alloc { address, bytes } => {
                live.insert(address, n);
                out.push(format!("+{bytes} #{n}"));
                n += 1;
            }
            TraceEvent::Free { address } => match live.remove(&address) {
                Some(i) => out.push(format!("-#{i}")),
                None => out.push(String::new()),
            },
            // Kept as empty places, so that the stages' indices stay the trace's.
            TraceEvent::Segment { .. } | TraceEvent::Other => out.push(String::new()),
        }
    }
    out
}

/// The emulation's events after `torch.zeros(1)` started CUDA (one allocation, freed), which
/// the trace does not hold.
fn emulated(events: &[Event]) -> Vec<String> {
    let mut n = 0;
    events[2..]
        .iter()
        .filter_map(|e| match *e {
            Event::Alloc { bytes, role, .. } => {
                n += 1;
                Some(format!("+{bytes} #{} ({})", n - 1, role.name()))
            }
            Event::Free { alloc } => Some(format!("-#{}", alloc - 1)),
            // Never met: `Program::events` gives a layer written again as its events.
            Event::Written { .. } => None,
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: compare-trace RECORD.json[.gz] [EVENTS_AROUND]");
    let around: usize = args.get(2).map_or(12, |a| a.parse().expect("a count"));
    let bytes = std::fs::read(path).expect("the record");
    let record: serde_json::Value = if path.ends_with(".gz") {
        serde_json::from_reader(flate2::read::GzDecoder::new(bytes.as_slice()))
    } else {
        serde_json::from_slice(&bytes)
    }
    .expect("JSON");
    let trace = Trace::from_record(&record).expect("a trace");
    let run = Run::from_spec(&record["spec"]).expect("a workload the budget emulates");
    let prog = program(&run);
    let events: Vec<Event> = prog.events().collect();
    let (all, b) = (recorded(&trace), emulated(&events));
    let a: Vec<String> = all.iter().filter(|e| !e.is_empty()).cloned().collect();
    let strip = |s: &str| s.split(" (").next().unwrap_or("").to_string();
    let part = a.iter().zip(&b).position(|(x, y)| *x != strip(y));
    println!("recorded {} events, emulated {}", a.len(), b.len());
    match part {
        None if a.len() == b.len() => println!("the sequences are equal"),
        None => println!(
            "equal up to the shorter one's end ({})",
            a.len().min(b.len())
        ),
        Some(i) => {
            let stage = trace
                .stages
                .iter()
                .find(|s| s.begin <= i && i < s.end)
                .map_or("?", |s| s.name.as_str());
            println!("they part at event {i} (stage {stage}):");
            for j in i.saturating_sub(around)..(i + around).min(a.len().max(b.len())) {
                let x = a.get(j).map_or("", String::as_str);
                let y = b.get(j).map_or("", String::as_str);
                let mark = if j == i { ">" } else { " " };
                println!("{mark} {j:>7}  {x:<24} {y}");
            }
        }
    }
    // Each stage's peaks: measured, the trace replayed through the allocator model, the
    // emulation replayed.
    let config = iteragpu_lab::allocator::AllocatorConfig {
        expandable_segments: record
            .pointer("/environment/alloc_conf")
            .and_then(|c| c.as_str())
            .is_some_and(|c| c.contains("expandable_segments:True")),
        ..Default::default()
    };
    let from_trace = trace.replay(config, &[4]);
    // The trace without the driver's segment addresses: the synthetic ones the budget uses.
    let mut synthetic = trace.clone();
    for e in &mut synthetic.events {
        if matches!(e, TraceEvent::Segment { .. }) {
            *e = TraceEvent::Other;
        }
    }
    let from_synthetic = synthetic.replay(config, &[4]);
    let driver = iteragpu_lab::allocator::AllocatorConfig {
        address_order: iteragpu_lab::allocator::AddressOrder::Driver,
        ..config
    };
    let from_driver = synthetic.replay(driver, &[4]);
    let from_emulation = prog.replay(driver, Device::Unlimited, OutsideBytes::NONE);
    println!(
        "stage: peak reserved measured / trace replayed / trace at rising synthetic addresses \
         (as the driver places them) / emulation replayed as the budget replays it"
    );
    for (i, m) in record["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let t = from_trace.get(i).map_or(0, |(_, f)| f.peak_reserved_bytes);
        let ts = from_synthetic
            .get(i)
            .map_or(0, |(_, f)| f.peak_reserved_bytes);
        let td = from_driver.get(i).map_or(0, |(_, f)| f.peak_reserved_bytes);
        let e = from_emulation
            .stages
            .get(i)
            .map_or(0, |(_, f, _)| f.peak_reserved_bytes);
        println!(
            "  {}: {} / {t} / {ts} ({td}) / {e}",
            m["stage"], m["peak_reserved"]
        );
    }
    // Stage by stage, the sizes asked for.
    let sizes = |events: &[String], begin: usize, end: usize| -> Vec<String> {
        events[begin.min(events.len())..end.min(events.len())]
            .iter()
            .filter(|e| e.starts_with('+'))
            .map(|e| e.split(' ').next().unwrap_or("").to_string())
            .collect()
    };
    let stages = prog.stages();
    for (i, s) in trace.stages.iter().enumerate() {
        let Some(e) = stages.get(i) else { break };
        let x = sizes(&all, s.begin, s.end);
        let y = sizes(&b, e.begin.saturating_sub(2), e.end.saturating_sub(2));
        match x.iter().zip(&y).position(|(p, q)| p != q) {
            None if x.len() == y.len() => {
                println!("stage {}: {} allocations, equal", s.name, x.len())
            }
            None => {
                let tail = |v: &[String]| v[v.len().saturating_sub(around)..].join(" ");
                println!(
                    "stage {}: {} allocations recorded, {} emulated, ending\n  recorded {}\n  emulated {}",
                    s.name,
                    x.len(),
                    y.len(),
                    tail(&x),
                    tail(&y)
                )
            }
            Some(k) => {
                let window =
                    |v: &[String]| v[k.saturating_sub(around)..(k + around).min(v.len())].join(" ");
                println!("stage {}: allocation {k} differs", s.name);
                println!("  recorded {}", window(&x));
                println!("  emulated {}", window(&y));
                continue;
            }
        }
        // The same sizes: where the frees part, allocations numbered from the stage's first.
        let relative = |events: &[String], begin: usize, end: usize| -> Vec<String> {
            let events: Vec<&String> = events[begin.min(events.len())..end.min(events.len())]
                .iter()
                .filter(|e| !e.is_empty())
                .collect();
            let first = events
                .iter()
                .find(|e| e.starts_with('+'))
                .and_then(|e| e.split('#').nth(1))
                .and_then(|n| n.split(' ').next())
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(0);
            events
                .iter()
                .map(|e| {
                    let id: i64 = e
                        .split('#')
                        .nth(1)
                        .and_then(|n| n.split(' ').next())
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    let size = e.split(' ').next().unwrap_or("");
                    if e.starts_with('+') {
                        format!("{size}@{}", id - first)
                    } else {
                        format!("-@{}", id - first)
                    }
                })
                .collect()
        };
        let x = relative(&all, s.begin, s.end);
        let y = relative(&b, e.begin.saturating_sub(2), e.end.saturating_sub(2));
        if let Some(k) = x.iter().zip(&y).position(|(p, q)| p != q) {
            let window =
                |v: &[String]| v[k.saturating_sub(around)..(k + around).min(v.len())].join(" ");
            println!("  its frees part at event {k} of the stage:");
            println!("  recorded {}", window(&x));
            println!("  emulated {}", window(&y));
        }
    }
}
