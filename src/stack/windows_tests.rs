//! The layers written again ([`super::repeat`]), their windows followed by the replay driver
//! ([`crate::replay`]), against the same programs replayed event by event through the blocks:
//! the same figures, on unlimited devices and on cards that make the allocator release its cache.

use super::run::{program, Run};
use crate::allocator::AllocatorConfig;
use crate::budget::proof::Report;
use crate::replay::{Device, OutsideBytes, Program, ProgramReplay, Replayed};

/// The replay of `p`, windows followed or not, with how many windows were followed and how
/// many of those had their blocks placed at a large allocation.
fn replayed(
    p: &Program,
    config: AllocatorConfig,
    capacity: Option<u64>,
    follow: bool,
) -> (Replayed, [u64; 2]) {
    let device = capacity.map_or(Device::Unlimited, |room| Device::Card { room });
    let mut r = ProgramReplay::new(config, device, OutsideBytes::NONE);
    r.windows.follow = follow;
    for chunk in p.chunks() {
        if !r.read(chunk) {
            break;
        }
    }
    let windows = [r.windows.followed, r.windows.placed_early];
    (r.finish(), windows)
}

/// Windows followed on a card that makes the allocator release its cache mid-window, in
/// runs of multi-head models whose keys and values grow in the small pool (where the size
/// searches of `--fit` used to stop at a kept block that no longer fitted): the figures of
/// the whole replay, with no window left unplaced.
#[test]
fn windows_followed_where_the_cache_is_released_give_the_whole_replay() {
    use crate::budget::workload::{Mode, Workload};
    let cases = [
        ("phi-3-mini", 46, 64, 16, true, 9_167_824_486),
        ("phi-3-mini", 36, 256, 16, false, 12_964_608_128),
        ("llama-2-7b", 43, 64, 16, false, 15_690_310_067),
    ];
    for (preset, batch, context, generated, expandable, capacity) in cases {
        let w = Workload {
            mode: Mode::Inference { generated },
            batch,
            context,
            ..Workload::preset(preset).expect("a preset")
        }
        .validated()
        .expect("a valid workload");
        let kernels =
            crate::stack::process::Kernels::for_gpu(crate::allocator::ComputeCapability::new(9, 0));
        let p = program(&w.runs(kernels)[0]);
        let config = crate::budget::compute::allocator_config(match expandable {
            true => crate::budget::AllocatorSetting::ExpandableSegments,
            false => crate::budget::AllocatorSetting::Default,
        });
        let (written, [followed, _]) = replayed(&p, config, Some(capacity), true);
        let (whole, _) = replayed(&p, config, Some(capacity), false);
        assert_eq!(written, whole, "{preset} batch {batch} on {capacity} B");
        assert!(followed > 0, "{preset}: windows followed");
    }
}

/// Every inference run of the six recorded proofs, replayed with the windows of its layers
/// written again followed and with every event through the blocks, under both settings, on
/// an unlimited device, on devices just below and just above its peak of `reserved`, and on
/// devices between its peaks of `allocated` and `reserved` (where the cache is released
/// during the run): the same figures, stage for stage, the same roles at the peak, the same
/// stage out of memory.
#[test]
fn windows_give_what_the_whole_replay_gives() {
    let reports = Report::all_recorded();
    // Windows followed, per setting and device, and those whose blocks were placed early.
    let (mut followed, mut placed) = ([[0; 5]; 2], 0);
    for rec in reports.iter().flat_map(|r| &r.records) {
        // Ranks of several (trainings, one refused) are not generated.
        if rec.spec.get("distributed").is_some() {
            continue;
        }
        let run = Run::from_spec(&rec.spec).expect("a recorded spec");
        if run.work.trains() {
            continue;
        }
        let p = program(&run);
        for expandable in [false, true] {
            let config = AllocatorConfig {
                expandable_segments: expandable,
                ..AllocatorConfig::default()
            };
            let (whole, _) = replayed(&p, config, None, false);
            let (allocated, reserved) = (whole.peak_allocated, whole.peak_reserved);
            let devices = [
                None,
                Some(reserved / 100 * 99),
                Some(reserved / 100 * 101),
                Some(allocated / 1000 * 1003),
                Some(allocated + (reserved - allocated) / 2),
            ];
            for (d, capacity) in devices.into_iter().enumerate() {
                let (written, [windows, early]) = replayed(&p, config, capacity, true);
                let (whole, _) = replayed(&p, config, capacity, false);
                assert_eq!(written, whole, "{} {config:?} {capacity:?}", rec.name);
                followed[usize::from(expandable)][d] += windows;
                placed += early;
            }
        }
    }
    println!(
        "windows followed (default, expandable; unlimited, 99 %, 101 % of the peak reserved, \
         0.3 % above the peak allocated, between the peaks): {followed:?}, {placed} with \
         their blocks placed at a large allocation"
    );
    // Just below the peak most runs stop before their decode (at the default settings, all).
    let [[plain, _, plain_above, ..], [grown, grown_below, grown_above, ..]] = followed;
    assert!(
        [plain, plain_above, grown, grown_above]
            .iter()
            .all(|&n| n > 100_000)
            && grown_below > 10_000,
        "{followed:?}"
    );
    // Where the cache is released, windows are still followed, some placed early.
    let between = followed[0][4] + followed[1][4];
    assert!(between > 10_000 && placed > 0, "{followed:?}, {placed}");
}
