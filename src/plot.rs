//! Charts as SVG strings, drawn with plotters and no system font: the allocator figures of every
//! phase of a measurement, timelines of allocator readings, sweeps, segment maps, and a budget's
//! stages and terms against GPU sizes. The same functions serve the
//! notebooks (shown inline) and the command line (`--plot FILE.svg`).

use crate::allocator::{Pool, SegmentView};
use crate::markup::Svg;
use crate::measure::{Measurement, PhaseRecord};
use crate::reading::{StepLog, StepReading};
use crate::units::Bytes;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;

const MIB: f64 = (1u64 << 20) as f64;
const GIB: f64 = crate::units::GIB as f64;

/// One series of a grouped bar chart.
struct Series {
    name: &'static str,
    color: RGBColor,
    values: Vec<f64>,
}

const ALLOCATED: [RGBColor; 3] = [
    RGBColor(158, 202, 225),
    RGBColor(66, 146, 198),
    RGBColor(8, 69, 148),
];
const RESERVED: [RGBColor; 3] = [
    RGBColor(253, 208, 162),
    RGBColor(241, 105, 19),
    RGBColor(140, 45, 4),
];

impl Measurement {
    /// The per-phase chart (see [`phase_chart`]).
    pub fn chart(&self) -> Svg {
        phase_chart(self)
    }
}

/// Grouped bars: for each phase row, allocated baseline/end/peak and reserved baseline/end/peak, in MiB.
pub fn phase_chart(m: &Measurement) -> Svg {
    type Field = fn(&PhaseRecord) -> u64;
    let fields: [(&'static str, RGBColor, Field); 6] = [
        ("allocated baseline", ALLOCATED[0], |p| {
            p.figures.allocated_baseline_bytes
        }),
        ("allocated end", ALLOCATED[1], |p| {
            p.figures.allocated_end_bytes
        }),
        ("allocated peak", ALLOCATED[2], |p| {
            p.figures.peak_allocated_bytes
        }),
        ("reserved baseline", RESERVED[0], |p| {
            p.figures.reserved_baseline_bytes
        }),
        ("reserved end", RESERVED[1], |p| {
            p.figures.reserved_end_bytes
        }),
        ("reserved peak", RESERVED[2], |p| {
            p.figures.peak_reserved_bytes
        }),
    ];
    let series: Vec<Series> = fields
        .into_iter()
        .map(|(name, color, field)| Series {
            name,
            color,
            values: m.phases.iter().map(|p| field(p) as f64 / MIB).collect(),
        })
        .collect();
    let labels: Vec<String> = m
        .phases
        .iter()
        .map(|p| match p.repetition {
            Some(r) => format!("warm {r}"),
            None => p.phase.name().replace("_forward", "").replace('_', " "),
        })
        .collect();
    let c = &m.configuration;
    let gpu = m.gpu_name();
    let title = format!(
        "{gpu}: batch {} context {} width {} hidden {} {} (MiB)",
        c.batch,
        c.context,
        c.width,
        c.hidden(),
        c.dtype.name()
    );
    grouped_bars(&title, &labels, &series)
}

/// Grouped bars on a logarithmic axis, so that a phase of a few hundred KiB stays visible beside
/// one of tens of MiB or of GiB; the legend sits in its own column, off the bars.
fn grouped_bars(title: &str, labels: &[String], series: &[Series]) -> Svg {
    canvas((960, 480), |root| {
        let (plot_area, legend_area) = root.split_horizontally(770);
        let values = || series.iter().flat_map(|s| s.values.iter().copied());
        let top = values().fold(0.0, f64::max).max(1e-3) * 2.0;
        // The floor of the axis: a decade below the smallest figure that is not zero.
        let smallest = values().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
        let bottom = if smallest.is_finite() {
            10f64.powf(smallest.log10().floor() - 1.0)
        } else {
            1e-3
        };
        let n = labels.len();
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(72)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (bottom..top).log_scale())
            .expect("valid ranges");
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| category(labels, *x))
            .y_desc("MiB (logarithmic: each line is 10 times the one below)")
            .draw()
            .expect("drawing to memory");
        let width = 0.84 / series.len() as f64;
        for (k, s) in series.iter().enumerate() {
            let color = s.color;
            chart
                .draw_series(s.values.iter().enumerate().filter(|(_, v)| **v > 0.0).map(
                    |(i, v)| {
                        let x0 = i as f64 - 0.42 + k as f64 * width;
                        Rectangle::new([(x0, bottom), (x0 + width * 0.92, *v)], color.filled())
                    },
                ))
                .expect("drawing to memory");
        }
        let entries: Vec<_> = series
            .iter()
            .map(|s| (s.name.to_string(), s.color, Swatch::Bar))
            .collect();
        legend_column(&legend_area, &entries, &["a bar absent: 0 bytes"]);
    })
}

/// The label of the category at `x` on an axis of one category per whole number.
fn category(labels: &[String], x: f64) -> String {
    let i = x.round();
    match labels.get(i as usize) {
        Some(label) if (x - i).abs() < 1e-6 && i >= 0.0 => label.clone(),
        _ => String::new(),
    }
}

/// How a legend entry is drawn: a bar's swatch or a line's.
#[derive(Clone, Copy)]
enum Swatch {
    Bar,
    Line,
}

/// A legend in its own column beside the plot, one entry a line from the top, then `notes`.
fn legend_column(
    area: &DrawingArea<SVGBackend, Shift>,
    entries: &[(String, RGBColor, Swatch)],
    notes: &[&str],
) {
    for (k, note) in notes.iter().enumerate() {
        let y = 60 + 22 * entries.len() as i32 + 8 + 16 * k as i32;
        area.draw(&Text::new(*note, (8, y), ("sans-serif", 12).into_font()))
            .expect("drawing to memory");
    }
    for (k, (name, color, swatch)) in entries.iter().enumerate() {
        let y = 60 + 22 * k as i32;
        match swatch {
            Swatch::Bar => area.draw(&Rectangle::new([(8, y), (20, y + 12)], color.filled())),
            Swatch::Line => area.draw(&PathElement::new(
                [(6, y + 6), (22, y + 6)],
                color.stroke_width(2),
            )),
        }
        .expect("drawing to memory");
        area.draw(&Text::new(
            name.as_str(),
            (28, y),
            ("sans-serif", 13).into_font(),
        ))
        .expect("drawing to memory");
    }
}

/// Allocated, reserved and GPU-used (runtime) over the steps of a log, in MiB.
pub fn step_chart(log: &StepLog) -> Svg {
    let steps: Vec<String> = log.steps.iter().map(|s| s.step.clone()).collect();
    let series = |f: fn(&StepReading) -> u64| log.steps.iter().map(f).collect::<Vec<u64>>();
    let mut lines = vec![
        ("allocated", series(|s| s.allocated)),
        ("reserved", series(|s| s.reserved)),
    ];
    // The runtime's view exists only for measured steps.
    if log.steps.iter().all(|s| s.runtime_used.is_some()) {
        lines.push((
            "GPU used (runtime)",
            series(|s| s.runtime_used.unwrap_or(0)),
        ));
    }
    let title = match &log.source {
        Some(source) => format!("{source}: allocator over the steps (MiB)"),
        None => "Allocator and runtime over the steps (MiB)".to_string(),
    };
    timeline_chart(&title, &steps, &lines)
}

impl crate::sweep::Sweep {
    /// The sweep's chart (see [`sweep_chart`]).
    pub fn chart(&self) -> Svg {
        sweep_chart(self)
    }
}

/// A sweep: measured peak allocated and reserved against the varied dimension, the model's
/// predicted peak reserved at every point (out-of-memory points included, marked), the capacity
/// the allocator can use, and the limit found. In GiB.
pub fn sweep_chart(sweep: &crate::sweep::Sweep) -> Svg {
    let rows = &sweep.rows;
    let gib = |b: u64| b as f64 / GIB;
    let limit = sweep.summary.limit.as_ref();
    let capacity = limit
        .and_then(|l| l.capacity)
        .map(|c| gib(c.for_allocator()));
    let device_total = sweep
        .summary
        .environment
        .as_ref()
        .and_then(|e| e.device.as_ref())
        .map(|d| gib(d.runtime_total.0));
    let xs: Vec<f64> = rows.iter().map(|r| r.value as f64).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(0.0, f64::max),
    );
    let (x0, x1) = if rows.is_empty() {
        (0.0, 1.0)
    } else {
        (x0, x1.max(x0 + 1.0))
    };
    let top = rows
        .iter()
        .flat_map(|r| [r.peak_reserved_bytes, r.predicted_peak_reserved_bytes])
        .flatten()
        .map(gib)
        .chain(capacity)
        .chain(device_total)
        .fold(1e-3, f64::max)
        * 1.08;
    let series = |f: fn(&crate::sweep::SweepRow) -> Option<u64>| -> Vec<(f64, f64)> {
        rows.iter()
            .filter_map(|r| f(r).map(|b| (r.value as f64, gib(b))))
            .collect()
    };
    let c = &sweep.summary.configuration;
    let gpu = sweep.gpu_name();
    let title = format!(
        "{gpu}: sweep of {} ({}, batch {} context {} width {} hidden {}), peaks in GiB",
        sweep.dimension,
        c.dtype,
        c.batch,
        c.context,
        c.width,
        c.hidden()
    );
    canvas((960, 520), |root| {
        let pad = (x1 - x0) * 0.03;
        let mut chart = ChartBuilder::on(root)
            .caption(&title, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d((x0 - pad)..(x1 + pad), 0f64..top)
            .expect("valid ranges");
        chart
            .configure_mesh()
            .x_desc(sweep.dimension.name())
            .y_desc("GiB")
            .draw()
            .expect("drawing to memory");
        // The prediction first and thin, the measurements over it: where the model is exact the
        // measured points sit on the predicted line.
        let grey = RGBColor(150, 150, 150);
        chart
            .draw_series(LineSeries::new(
                series(|r| r.predicted_peak_reserved_bytes),
                grey.stroke_width(6),
            ))
            .expect("drawing to memory")
            .label("predicted peak reserved (model)")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], grey.stroke_width(6)));
        type Line = (&'static str, RGBColor, u32, Vec<(f64, f64)>);
        let lines: [Line; 2] = [
            (
                "measured peak reserved",
                RESERVED[1],
                4,
                series(|r| r.peak_reserved_bytes),
            ),
            (
                "measured peak allocated",
                ALLOCATED[2],
                2,
                series(|r| r.peak_allocated_bytes),
            ),
        ];
        for (name, color, radius, points) in lines {
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(1)))
                .expect("drawing to memory")
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 7, y), radius, color.filled()));
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|p| Circle::new(*p, radius, color.filled())),
                )
                .expect("drawing to memory");
        }
        if let Some(total) = device_total {
            let dark = RGBColor(60, 60, 60);
            level(
                &mut chart,
                (x0 - pad, x1 + pad),
                total,
                dark,
                "device memory (runtime total)",
            );
        }
        let red = RGBColor(200, 30, 30);
        let ooms: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.status == crate::sweep::PointStatus::Oom)
            .map(|r| {
                (
                    r.value as f64,
                    r.predicted_peak_reserved_bytes.map_or(top * 0.95, gib),
                )
            })
            .collect();
        chart
            .draw_series(ooms.iter().map(|p| Cross::new(*p, 7, red.stroke_width(3))))
            .expect("drawing to memory")
            .label("out of memory")
            .legend(move |(x, y)| Cross::new((x + 7, y), 5, red.stroke_width(2)));
        if let Some(cap) = capacity {
            let green = RGBColor(49, 163, 84);
            level(
                &mut chart,
                (x0 - pad, x1 + pad),
                cap,
                green,
                "capacity of the allocator",
            );
        }
        if let Some(found) = limit.and_then(|l| l.found) {
            let black = RGBColor(0, 0, 0);
            chart
                .draw_series(LineSeries::new(
                    [(found as f64, 0.0), (found as f64, top)],
                    black.stroke_width(1),
                ))
                .expect("drawing to memory")
                .label(format!("limit found: {found}"))
                .legend(move |(x, y)| PathElement::new([(x + 7, y - 6), (x + 7, y + 6)], black));
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft, 0.85);
    })
}

/// The allocator's map: one bar per segment (in address order), each bar the whole segment, its
/// blocks drawn in proportion inside it and named (live blocks coloured by tensor, cached free
/// blocks grey, the free parts of a split segment hatched darker). Every segment gets the same
/// width so that a 2 MiB segment stays as readable as a 2 GiB one; the sizes are written beside.
pub fn segment_map(title: &str, segments: &[SegmentView]) -> Svg {
    let row = 34i32;
    let (left, width) = (190i32, 740i32);
    let height = 60 + row * segments.len().max(1) as i32 + 40;
    canvas((960, height as u32), |root| {
        let text = |s: &str, x: i32, y: i32, size: u32, color: &RGBColor| {
            root.draw(&Text::new(
                s.to_string(),
                (x, y),
                ("sans-serif", size).into_font().color(color),
            ))
            .expect("drawing to memory");
        };
        text(title, 12, 12, 17, &BLACK);
        if segments.is_empty() {
            text(
                "no segment: the allocator holds no memory",
                12,
                50,
                14,
                &BLACK,
            );
        }
        let mut names: Vec<&str> = Vec::new();
        for (i, seg) in segments.iter().enumerate() {
            let y = 50 + row * i as i32;
            let label = format!(
                "{} {}",
                match seg.pool {
                    Pool::Small => "small",
                    Pool::Large => "large",
                },
                Bytes(seg.size).mib_text()
            );
            text(&label, 12, y + 8, 13, &BLACK);
            let mut x = left as f64;
            let end = (left + width) as f64;
            for b in &seg.blocks {
                // In proportion, but a live block is never thinner than 6 px, so that a 512-byte
                // tensor in a 2 MiB segment still shows (its size is written in the legend).
                let mut w = width as f64 * b.size as f64 / seg.size.max(1) as f64;
                if b.allocated {
                    w = w.max(6.0);
                }
                let w = w.min(end - x).max(1.0);
                let (x0, x1) = (x.round() as i32, (x + w).round() as i32);
                let color = match &b.label {
                    Some(name) => {
                        if !names.contains(&name.as_str()) {
                            names.push(name.as_str());
                        }
                        tensor_color(name)
                    }
                    None if b.inactive_split => RGBColor(170, 170, 170),
                    None => RGBColor(225, 225, 225),
                };
                root.draw(&Rectangle::new(
                    [(x0, y), (x1, y + row - 8)],
                    color.filled(),
                ))
                .expect("drawing to memory");
                root.draw(&Rectangle::new(
                    [(x0, y), (x1, y + row - 8)],
                    WHITE.stroke_width(1),
                ))
                .expect("drawing to memory");
                let name = b.label.as_deref().unwrap_or("free");
                let caption = format!("{name} {}", Bytes(b.size).mib_text());
                if (x1 - x0) as usize > caption.len() * 6 + 6 {
                    text(&caption, x0 + 4, y + 8, 11, &BLACK);
                }
                x += w;
            }
        }
        // The legend: every name drawn, and the two kinds of free block.
        let y = 50 + row * segments.len().max(1) as i32 + 6;
        let mut x = 12;
        let mut entries: Vec<(String, RGBColor)> = names
            .iter()
            .map(|n| (n.to_string(), tensor_color(n)))
            .collect();
        entries.push(("free (cached)".into(), RGBColor(225, 225, 225)));
        entries.push(("free, in a split segment".into(), RGBColor(170, 170, 170)));
        for (name, color) in entries {
            root.draw(&Rectangle::new([(x, y), (x + 12, y + 12)], color.filled()))
                .expect("drawing to memory");
            text(&name, x + 16, y, 12, &BLACK);
            x += 22 + 7 * name.len() as i32;
            if x > 880 {
                break;
            }
        }
    })
}

/// A fixed colour per tensor name, so that the same tensor looks the same in every map.
fn tensor_color(name: &str) -> RGBColor {
    const PALETTE: [RGBColor; 10] = [
        RGBColor(66, 146, 198),
        RGBColor(158, 202, 225),
        RGBColor(8, 81, 156),
        RGBColor(107, 174, 214),
        RGBColor(253, 174, 107),
        RGBColor(116, 196, 118),
        RGBColor(49, 163, 84),
        RGBColor(241, 105, 19),
        RGBColor(158, 154, 200),
        RGBColor(117, 107, 177),
    ];
    const NAMES: [&str; 10] = [
        "linear1.weight",
        "linear1.bias",
        "linear2.weight",
        "linear2.bias",
        "input",
        "hidden",
        "gelu",
        "output",
        "cublas_workspace",
        "cublaslt_workspace",
    ];
    const OTHERS: [RGBColor; 8] = [
        RGBColor(230, 85, 13),
        RGBColor(49, 130, 189),
        RGBColor(117, 107, 177),
        RGBColor(99, 99, 99),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(214, 39, 40),
        RGBColor(140, 86, 75),
    ];
    match NAMES.iter().position(|n| *n == name) {
        Some(i) => PALETTE[i],
        // Any other name (the live lesson's tensors): a colour of its own, the same every time.
        None => OTHERS[name.bytes().fold(0usize, |h, b| h * 31 + b as usize) % OTHERS.len()],
    }
}

/// Lines over steps: one named series of byte counts per line, shown in MiB.
pub fn timeline_chart(title: &str, steps: &[String], lines: &[(&'static str, Vec<u64>)]) -> Svg {
    let palette = [
        ALLOCATED[2],
        RESERVED[1],
        RGBColor(90, 90, 90),
        RGBColor(49, 163, 84),
    ];
    canvas((960, 420), |root| {
        let top = lines
            .iter()
            .flat_map(|(_, v)| v.iter().map(|b| *b as f64 / MIB))
            .fold(0.0, f64::max)
            .max(1e-3)
            * 1.15;
        let n = steps.len().max(1);
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(72)
            .build_cartesian_2d(0usize..(n - 1).max(1), 0f64..top)
            .expect("valid ranges");
        chart
            .configure_mesh()
            .x_labels(n)
            .x_label_formatter(&|i| (i + 1).to_string())
            .x_desc("step (see the table)")
            .y_desc("MiB")
            .draw()
            .expect("drawing to memory");
        for (k, (name, values)) in lines.iter().enumerate() {
            let color = palette[k % palette.len()];
            chart
                .draw_series(LineSeries::new(
                    values.iter().enumerate().map(|(i, b)| (i, *b as f64 / MIB)),
                    color.stroke_width(2),
                ))
                .expect("drawing to memory")
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2))
                });
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft, 0.85);
    })
}

/// Each replayed stage of a budget: its peaks of `allocated` and `reserved` side by side, each
/// standing on what lives outside the allocator during the stage (it grows as the process loads
/// its kernels), in GiB on a linear axis (the gap between the two is the allocator's cache),
/// against the room of each of `cards` (name, bytes: the card less the reserve).
pub fn stage_chart(b: &crate::budget::Budget, cards: &[(String, u64)]) -> Svg {
    let gib = |x: u64| x as f64 / GIB;
    let n = b.stages.len().max(1);
    let stages: Vec<String> = b.stages.iter().map(|s| s.stage.clone()).collect();
    let top = b
        .stages
        .iter()
        .map(|s| gib(s.peak_reserved.0 + s.outside.0))
        .chain(cards.iter().map(|c| gib(c.1)))
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.12;
    let card_colors = [
        RGBColor(200, 30, 30),
        RGBColor(90, 90, 90),
        RGBColor(49, 163, 84),
    ];
    canvas((1040, 460), |root| {
        let (plot_area, legend_area) = root.split_horizontally(730);
        let mut entries = Vec::new();
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(
                format!("{}: peaks of each replayed stage", b.workload.source),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(72)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
            .expect("valid ranges");
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| category(&stages, *x))
            .y_desc("GiB (2^30 bytes)")
            .draw()
            .expect("drawing to memory");
        type Peak = fn(&crate::budget::compute::StagePeak) -> u64;
        let series: [(&str, RGBColor, Peak); 2] = [
            ("peak allocated", ALLOCATED[2], |s| s.peak_allocated.0),
            ("peak reserved", RESERVED[1], |s| s.peak_reserved.0),
        ];
        let outside = RGBColor(170, 170, 170);
        for (k, (name, color, peak)) in series.into_iter().enumerate() {
            chart
                .draw_series(b.stages.iter().enumerate().flat_map(|(i, s)| {
                    let x0 = i as f64 - 0.4 + k as f64 * 0.4;
                    let base = gib(s.outside.0);
                    [
                        Rectangle::new([(x0, 0.0), (x0 + 0.37, base)], outside.filled()),
                        Rectangle::new(
                            [(x0, base), (x0 + 0.37, base + gib(peak(s)))],
                            color.filled(),
                        ),
                    ]
                }))
                .expect("drawing to memory");
            entries.push((name.to_string(), color, Swatch::Bar));
        }
        entries.push(("outside the allocator".to_string(), outside, Swatch::Bar));
        for (k, (name, room)) in cards.iter().enumerate() {
            let color = card_colors[k % card_colors.len()];
            let y = gib(*room);
            chart
                .draw_series(LineSeries::new(
                    [(-0.5, y), (n as f64 - 0.5, y)],
                    color.stroke_width(2),
                ))
                .expect("drawing to memory");
            let label = format!("{name}: {}", Bytes(*room).gib_text());
            entries.push((label, color, Swatch::Line));
        }
        legend_column(
            &legend_area,
            &entries,
            &[
                "each peak stands on what lives outside",
                "the allocator (CUDA, its libraries);",
                "a line: the card less the reserve",
            ],
        );
    })
}

/// The budget stacked term by term, on 1, 2, 4 and 8 GPUs under the fit planner's split rule,
/// against the memory of each GPU model of `catalog` (dashed lines, named).
pub fn budget_chart(b: &crate::budget::Budget, catalog: &crate::catalog::Catalog) -> Svg {
    const PALETTE: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(174, 199, 232),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
    ];
    let gpus = [1u64, 2, 4, 8];
    // Each term's share on n GPUs, at the peak moment for n; terms never held are left out.
    let shares: Vec<Vec<f64>> = gpus
        .iter()
        .map(|&n| {
            crate::budget::fit::shares(b, n)
                .iter()
                .map(|&x| x as f64 / GIB)
                .collect()
        })
        .collect();
    let shown: Vec<usize> = (0..b.terms.len())
        .filter(|&k| shares.iter().any(|s| s[k] > 0.0))
        .collect();
    // (GiB, as the catalog writes it, the models of that size)
    let mut sizes: Vec<(f64, String, String)> = Vec::new();
    for row in &catalog.rows {
        let text = row.memory_per_gpu_gib.to_string();
        match sizes.iter_mut().find(|(_, t, _)| *t == text) {
            Some((_, _, names)) => {
                if !names.split(", ").any(|n| n == row.model) {
                    *names += &format!(", {}", row.model);
                }
            }
            None => sizes.push((text.parse().unwrap_or(0.0), text, row.model.clone())),
        }
    }
    sizes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let tallest = shares
        .iter()
        .map(|s| s.iter().sum::<f64>())
        .fold(0.0, f64::max);
    // The axis reaches the tallest bar and the first GPU size above it, so that bars stay
    // readable beside a catalog of much larger GPUs; the sizes above are listed beside the chart.
    let first_above = sizes
        .iter()
        .map(|(g, _, _)| *g)
        .filter(|g| *g >= tallest)
        .fold(f64::INFINITY, f64::min);
    let reach = if first_above.is_finite() {
        first_above
    } else {
        tallest
    };
    let top = (tallest * 1.15).max(reach).max(1e-3) * 1.06;
    let (on_scale, off_scale): (Vec<_>, Vec<_>) =
        sizes.into_iter().partition(|(g, _, _)| *g <= top);
    let sizes = on_scale;
    let title = format!("Budget per GPU: {}", b.title());
    let title = if title.chars().count() > 110 {
        format!("{}…", title.chars().take(109).collect::<String>())
    } else {
        title
    };
    canvas((1180, 600), |root| {
        let (plot_area, legend_area) = root.split_horizontally(860);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(&title, ("sans-serif", 15))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..6.2f64, 0f64..top)
            .expect("valid ranges");
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc("GiB per GPU")
            .draw()
            .expect("drawing to memory");
        for (i, n) in gpus.iter().enumerate() {
            let x = i as f64 + 0.2;
            let mut bottom = 0.0;
            for (c, &k) in shown.iter().enumerate() {
                let h = shares[i][k];
                let color = PALETTE[c % PALETTE.len()];
                chart
                    .draw_series([Rectangle::new(
                        [(x, bottom), (x + 0.6, bottom + h)],
                        color.filled(),
                    )])
                    .expect("drawing to memory");
                bottom += h;
            }
            chart
                .draw_series([Text::new(
                    format!(
                        "{n} GPU{}: {:.1} GiB",
                        if *n > 1 { "s" } else { "" },
                        bottom
                    ),
                    (x - 0.05, -top * 0.045),
                    ("sans-serif", 13),
                )])
                .expect("drawing to memory");
        }
        // Sizes closer than 3 % of the axis share one label, so that no two labels overlap.
        let mut clusters: Vec<(f64, f64, Vec<String>)> = Vec::new();
        for (gib, _, names) in &sizes {
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, *gib), (4.0, *gib)],
                    6,
                    4,
                    BLACK.mix(0.45).stroke_width(1),
                ))
                .expect("drawing to memory");
            match clusters.last_mut() {
                Some((_, hi, all)) if *gib - *hi < top * 0.03 => {
                    *hi = *gib;
                    all.push(names.clone());
                }
                _ => clusters.push((*gib, *gib, vec![names.clone()])),
            }
        }
        for (lo, hi, names) in clusters {
            let range = if hi > lo {
                format!("{lo:.2}–{hi:.2} GiB")
            } else {
                format!("{lo:.2} GiB")
            };
            chart
                .draw_series([Text::new(
                    format!("{range}: {}", names.join(", ")),
                    (4.05, hi),
                    ("sans-serif", 11),
                )])
                .expect("drawing to memory");
        }
        let mut entries: Vec<_> = shown
            .iter()
            .enumerate()
            .rev()
            .map(|(c, &k)| {
                let t = &b.terms[k];
                let name = format!("{} ({})", t.name, t.status.name());
                (name, PALETTE[c % PALETTE.len()], Swatch::Bar)
            })
            .collect();
        let grey = RGBColor(115, 115, 115);
        entries.push(("dashed: a GPU model's memory".into(), grey, Swatch::Line));
        if !off_scale.is_empty() {
            entries.push(("above the scale:".into(), WHITE, Swatch::Line));
        }
        for (gib, _, names) in &off_scale {
            entries.push((format!("  {gib:.2} GiB: {names}"), WHITE, Swatch::Line));
        }
        legend_column(&legend_area, &entries, &[]);
    })
}

/// A labelled horizontal line at `y` across `x` (a device's memory, the allocator's capacity).
fn level<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<
        'a,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    x: (f64, f64),
    y: f64,
    color: RGBColor,
    label: &str,
) {
    chart
        .draw_series(LineSeries::new([(x.0, y), (x.1, y)], color.stroke_width(1)))
        .expect("drawing to memory")
        .label(label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color));
}

/// Draws on a white SVG canvas of `size` pixels and returns the SVG text.
fn canvas(size: (u32, u32), draw: impl FnOnce(&DrawingArea<SVGBackend, Shift>)) -> Svg {
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
        root.fill(&WHITE).expect("drawing to memory");
        draw(&root);
        root.present().expect("drawing to memory");
    }
    Svg(text)
}

/// The series legend at `position`, on a white background of `opacity`.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    opacity: f64,
) {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(opacity))
        .border_style(BLACK)
        .draw()
        .expect("drawing to memory");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_measurement_renders() {
        let m: Measurement = serde_json::from_slice(include_bytes!(
            "../data/exemple-mesure-h200-petit-essai.json"
        ))
        .unwrap();
        let svg = phase_chart(&m).0;
        assert!(svg.starts_with("<svg") && svg.contains("NVIDIA H200"));
        assert!(svg.contains("cold") && svg.contains("warm 2") && svg.contains("reserved peak"));
        assert!(svg.matches("<rect").count() >= 6 * m.phases.len());
    }

    #[test]
    fn a_segment_map_names_every_block() {
        let cc = crate::allocator::ComputeCapability::new(9, 0);
        let ws = crate::allocator::Workspaces::for_gpu(cc, &Default::default()).unwrap();
        let p = crate::measure::predict(&Default::default(), cc, ws).unwrap();
        let svg = segment_map("cold pass", &p.phases[2].segments_at_end).0;
        for name in [
            "cublas_workspace",
            "cublaslt_workspace",
            "linear1.weight",
            "free (cached)",
        ] {
            assert!(svg.contains(name), "{name}");
        }
        assert!(svg.contains("large 32.00 MiB") && svg.contains("small 2.00 MiB"));
    }

    #[test]
    fn a_stage_chart_shows_both_peaks_of_every_stage_and_the_cards() {
        let w = crate::budget::Workload {
            batch: 2,
            context: 256,
            ..crate::budget::Workload::preset("qwen2.5-0.5b").unwrap()
        }
        .validated()
        .unwrap();
        let b = crate::budget::budget(&w, &crate::budget::BudgetSettings::h200());
        let svg = stage_chart(&b, &[("small card".into(), 1 << 30)]).0;
        for stage in ["weights", "inputs", "prefill", "decode"] {
            assert!(svg.contains(stage), "{stage}");
        }
        assert!(svg.contains("peak reserved") && svg.contains("small card: 1.00 GiB"));
        assert!(svg.contains("outside the allocator"));
        // Two bars per stage, each on what lives outside the allocator, and three swatches.
        assert!(svg.matches("<rect").count() >= 4 * b.stages.len() + 3);
    }

    #[test]
    fn a_budget_chart_names_every_term_and_gpu_size() {
        use crate::budget::*;
        let w = Workload {
            mode: Mode::Full {
                optimizer: Optimizer::Adamw,
            },
            batch: 1,
            context: 2048,
            checkpointing: true,
            ..Workload::preset("llama-3.2-1b").unwrap()
        };
        let b = budget(&w.validated().unwrap(), &BudgetSettings::h200());
        let catalog = crate::catalog::Catalog::parse(crate::catalog::BUILTIN_CSV, "c").unwrap();
        let svg = budget_chart(&b, &catalog).0;
        for name in [
            "Optimizer states (exact)",
            "Activations and temporaries (replayed)",
            "8 GPUs",
            "22.03 GiB: l4",
            // The axis ends at the first size above the tallest bar; larger ones are listed.
            "above the scale:",
            "23.99 GiB: rtx4090",
            "139.80 GiB: h200",
        ] {
            assert!(svg.contains(name), "{name}");
        }
        let tallest = fit::need_per_gpu(&b, 1);
        assert!(tallest < 22 << 30, "the chart's premise: {tallest} B");
    }

    #[test]
    fn a_timeline_renders() {
        let svg = timeline_chart(
            "t",
            &["a".into(), "b".into()],
            &[("allocated", vec![0, 1 << 20])],
        )
        .0;
        assert!(svg.contains("allocated") && svg.contains("<polyline"));
    }
}
