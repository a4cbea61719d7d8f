//! A TEST FIXTURE, never a measurement: lesson records made by the allocator model alone, on a
//! device of a given capacity, for the tests of the record, its rendering and the command line.
//! Its GPU is named so that no reader can take it for a GPU run.

use iteragpu_lab::allocator::size::LARGE_BUFFER;
use iteragpu_lab::allocator::ComputeCapability;
use iteragpu_lab::device::CudaDevice;
use iteragpu_lab::environment::{EnvironmentReport, GpuInfo};
use iteragpu_lab::lesson::{
    AllocatorSettings, LessonModel, LessonRecord, LessonScript, StepRecord,
};
use iteragpu_lab::units::Bytes;

/// The name the fixture gives its device.
pub const FIXTURE_GPU: &str = "TEST FIXTURE: the allocator model, no GPU";
/// Memory the fixture's "runtime" counts outside the allocator (the H200's CUDA context).
const OUTSIDE: u64 = 552_402_944;

/// PyTorch's default allocator settings, as the allocator reports them.
pub fn default_settings() -> AllocatorSettings {
    AllocatorSettings {
        expandable_segments: false,
        large_segment_size: LARGE_BUFFER,
        max_split_size: None,
        parsed: String::new(),
    }
}

/// `script` replayed on the model, on a device of `capacity` bytes (its free memory sizes the
/// relative steps), recorded as a lesson record with `settings` and `configuration`.
pub fn model_record(
    capacity: u64,
    script: &LessonScript,
    configuration: Option<String>,
    settings: AllocatorSettings,
) -> LessonRecord {
    let mut m = LessonModel::with_expandable_segments(
        ComputeCapability::new(9, 0),
        settings.expandable_segments,
    )
    .unwrap();
    let runtime = |reserved: u64| Some(reserved + OUTSIDE);
    let last = |m: &LessonModel| {
        let mut reading = m.log.steps.last().unwrap().clone();
        reading.runtime_used = runtime(reading.reserved);
        (
            reading,
            *m.stats.last().unwrap(),
            m.maps.last().unwrap().clone(),
        )
    };
    let (reading, stats, map) = last(&m);
    let mut steps = vec![StepRecord {
        step: None,
        resolved: None,
        reading,
        stats,
        map,
    }];
    for step in &script.steps {
        let (reading, stats, _) = last(&m);
        let free = capacity - reading.runtime_used.unwrap();
        let releasable = reading.reserved - reading.allocated - stats.inactive_split_bytes;
        let resolved = step.resolve(free, releasable);
        let label = step.label(resolved.as_ref());
        m.run(step, resolved.as_ref(), &label).unwrap();
        let (reading, stats, map) = last(&m);
        steps.push(StepRecord {
            step: Some(step.clone()),
            resolved,
            reading,
            stats,
            map,
        });
    }
    let device = CudaDevice { index: 0 };
    let mut environment = EnvironmentReport::without_libtorch(Some(device), Default::default());
    environment.device = Some(GpuInfo {
        index: 0,
        name: FIXTURE_GPU.into(),
        compute_capability: "9.0".into(),
        multiprocessors: 0,
        total_memory: Bytes(capacity),
        runtime_free: Bytes(capacity - OUTSIDE),
        runtime_total: Bytes(capacity),
    });
    LessonRecord::new(environment, configuration, settings, steps)
}

/// The standard lesson on the model, on a 16 GiB device, default settings.
pub fn standard() -> LessonRecord {
    model_record(
        16 << 30,
        &LessonScript::standard(),
        None,
        default_settings(),
    )
}
