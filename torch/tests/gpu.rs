//! GPU tests: real measurements on a CUDA device. They run only with `--features gpu-tests` (on a
//! GPU machine, see scripts/gpu/proof.py); elsewhere cargo lists them as ignored, with the reason.

use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::measure::{MeasureConfig, Phase};
use iteragpu_torch::{measure, tch, Allocator};

const GPU0: CudaDevice = CudaDevice { index: 0 };

#[test]
#[cfg_attr(
    not(feature = "gpu-tests"),
    ignore = "needs a CUDA GPU: run with --features gpu-tests"
)]
fn small_measurement_is_consistent() {
    let config = MeasureConfig::default().validated().unwrap();
    let m = measure(&config).unwrap();
    let names: Vec<_> = m.phases.iter().map(|p| p.phase).collect();
    assert_eq!(
        names,
        [
            Phase::ModelLoad,
            Phase::Inputs,
            Phase::ColdForward,
            Phase::Warmup,
            Phase::WarmForward,
            Phase::WarmForward
        ]
    );
    for p in &m.phases {
        assert!(p.allocated_end_bytes <= p.reserved_end_bytes, "{p:?}");
        assert!(p.peak_allocated_bytes >= p.allocated_end_bytes.max(p.allocated_baseline_bytes));
        assert!(p.peak_reserved_bytes >= p.reserved_end_bytes);
        assert!(p.gpu_event_time_ms >= 0.0 && p.host_wall_time_ms > 0.0);
    }
    let load = &m.phases[0];
    // Each of the four parameter tensors is rounded up to the allocator's 512-byte blocks.
    let rounded: u64 = [64 * 256 * 4, 256 * 4, 256 * 64 * 4, 64 * 4]
        .iter()
        .map(|b: &u64| b.next_multiple_of(512))
        .sum();
    assert_eq!(
        load.allocated_end_bytes - load.allocated_baseline_bytes,
        rounded
    );
    assert!(m.environment.device.as_ref().unwrap().total_memory.0 > 0);
}

#[test]
#[cfg_attr(
    not(feature = "gpu-tests"),
    ignore = "needs a CUDA GPU: run with --features gpu-tests"
)]
fn allocator_tracks_a_tensor_and_keeps_its_block_after_free() {
    let a = Allocator::open(GPU0).unwrap();
    let read = |a: &Allocator| {
        a.synchronize().unwrap();
        a.reading().unwrap()
    };
    let before = read(&a);
    let t = tch::Tensor::zeros([64 << 20], (tch::Kind::Float, a.device())); // 256 MiB
    let during = read(&a);
    assert_eq!(during.allocated - before.allocated, 256 << 20);
    drop(t);
    let after = read(&a);
    assert_eq!(after.allocated, before.allocated);
    assert_eq!(
        after.reserved, during.reserved,
        "the cache keeps the freed block"
    );
    a.empty_cache().unwrap();
    assert!(read(&a).reserved < during.reserved);
}

#[test]
#[cfg_attr(
    not(feature = "gpu-tests"),
    ignore = "needs a CUDA GPU: run with --features gpu-tests"
)]
fn a_missing_device_is_refused() {
    let err = Allocator::open(CudaDevice { index: 4096 }).err().unwrap();
    assert!(err.to_string().contains("does not exist"), "{err}");
}
