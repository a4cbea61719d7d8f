//! GPU tests: real measurements on a CUDA device. They run only with `--features gpu-tests` (on a
//! GPU machine, see scripts/gpu/proof.py); elsewhere cargo lists them as ignored, with the reason.
//! One check runs everywhere: without a GPU, the lesson is refused, never simulated.

use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::measure::MeasureConfig;
use iteragpu_lab::reading::Phase;
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
        assert!(
            p.figures.allocated_end_bytes <= p.figures.reserved_end_bytes,
            "{p:?}"
        );
        assert!(
            p.figures.peak_allocated_bytes
                >= p.figures
                    .allocated_end_bytes
                    .max(p.figures.allocated_baseline_bytes)
        );
        assert!(p.figures.peak_reserved_bytes >= p.figures.reserved_end_bytes);
        assert!(p.gpu_event_time_ms >= 0.0 && p.host_wall_time_ms > 0.0);
    }
    let load = &m.phases[0];
    // Each of the four parameter tensors is rounded up to the allocator's 512-byte blocks.
    let rounded: u64 = [64 * 256 * 4, 256 * 4, 256 * 64 * 4, 64 * 4]
        .iter()
        .map(|b: &u64| b.next_multiple_of(512))
        .sum();
    assert_eq!(
        load.figures.allocated_end_bytes - load.figures.allocated_baseline_bytes,
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

/// Where the parent test below asks its child process to write the lesson.
const LESSON_CHILD: &str = "IGL_LESSON_CHILD_OUTPUT";

/// The child half of the next test: the lesson in a process of its own (this test binary run
/// again on this test alone), so that no other test's tensors or cache reach its figures. Run
/// without the parent, it does nothing.
#[test]
#[cfg_attr(
    not(feature = "gpu-tests"),
    ignore = "needs a CUDA GPU: run with --features gpu-tests"
)]
fn lesson_child_process() {
    let Some(output) = std::env::var_os(LESSON_CHILD) else {
        return;
    };
    let script = iteragpu_lab::lesson::LessonScript::standard();
    let record = iteragpu_torch::lesson(GPU0, &script, None).unwrap();
    iteragpu_lab::files::write_new_json(std::path::Path::new(&output), &record).unwrap();
}

/// The standard lesson in a fresh process, with PyTorch's default settings: every step's
/// allocated, reserved, both peaks, requested, segment count and statistics (inactive split bytes
/// and blocks, retries, out-of-memory errors) equal to the allocator model's, the last two steps
/// given the free memory they ran with; the cache released by the allocator itself before the last
/// allocation (one retry), which succeeded.
#[test]
#[cfg_attr(
    not(feature = "gpu-tests"),
    ignore = "needs a CUDA GPU: run with --features gpu-tests"
)]
fn the_lesson_is_measured_as_the_model_predicts() {
    use iteragpu_lab::lesson::record::same_figures;
    use iteragpu_lab::lesson::LessonRecord;
    let dir = std::env::temp_dir().join(format!("igl-gpu-lesson-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = dir.join("lesson.json");
    let _ = std::fs::remove_file(&output);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "lesson_child_process",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(LESSON_CHILD, &output);
    // PyTorch's defaults in the child: no allocator or workspace setting inherited.
    for name in [
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "CUBLAS_WORKSPACE_CONFIG",
        "CUBLASLT_WORKSPACE_SIZE",
        "TORCH_CUBLASLT_UNIFIED_WORKSPACE",
        "DISABLE_ADDMM_CUDA_LT",
    ] {
        child.env_remove(name);
    }
    let run = child.output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stdout)
    );
    let r = LessonRecord::load(&output).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        r.allocator_settings.is_default(),
        "{:?}",
        r.allocator_settings
    );
    let m = r.model().unwrap();
    assert_eq!(m.log.steps.len(), r.steps.len());
    for (i, (s, (p, stats))) in r
        .steps
        .iter()
        .zip(m.log.steps.iter().zip(&m.stats))
        .enumerate()
    {
        assert!(
            same_figures(&s.reading, p),
            "step {}: measured {:?}, predicted {p:?}",
            i + 1,
            s.reading
        );
        assert_eq!(s.stats, *stats, "step {}: {}", i + 1, s.reading.step);
    }
    let (before, last) = (&r.steps[r.steps.len() - 2], r.steps.last().unwrap());
    assert_eq!(last.stats.alloc_retries, before.stats.alloc_retries + 1);
    assert_eq!(last.stats.ooms, 0);
    assert!(last
        .map
        .iter()
        .flat_map(|s| &s.blocks)
        .any(|b| b.label.as_deref() == Some("more")));
}

/// Without a GPU the lesson is refused as unavailable (exit 2 on the command line), never
/// simulated. (On a machine with a GPU there is nothing to check here.)
#[test]
fn without_a_gpu_the_lesson_is_unavailable() {
    use iteragpu_lab::status::{Classify, Status};
    if tch::Cuda::is_available() {
        return;
    }
    let script = iteragpu_lab::lesson::LessonScript::standard();
    let e = iteragpu_torch::lesson(GPU0, &script, None).unwrap_err();
    assert_eq!(e.status(), Status::Unavailable, "{e}");
}
