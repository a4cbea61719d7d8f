//! The live lesson without a GPU: its script, its record (JSON round trip, refusals), the
//! notebook's rendering of a record (measured, recorded elsewhere, missing), and the command line's
//! refusals (no GPU or no companion: 2; an existing output: 4; a conflicting
//! PYTORCH_CUDA_ALLOC_CONF: 64). Records here are made by the allocator model: TEST FIXTURES
//! (`common::lesson`), never measurements.

use crate::common;

use assert_cmd::Command;
use common::lesson::{default_settings, model_record, standard, FIXTURE_GPU};
use common::{
    engine_args, mesure_memoire as mm, stand_in_companion, OUTPUT_EXISTS, UNAVAILABLE, USAGE,
};
use iteragpu_lab::lesson::record::{EXPANDABLE_SEGMENTS, RECORDED_DEFAULT, RECORDED_EXPANDABLE};
use iteragpu_lab::lesson::{
    AllocatorSettings, LessonRecord, LessonScript, LessonView, Lessons, Step,
};
use iteragpu_lab::markup::labels;
use iteragpu_lab::shown::Shown;
use predicates::str::contains;
use std::path::Path;

const MIB: u64 = 1 << 20;

#[test]
fn the_standard_script_is_the_notebooks_sequence_then_the_retry() {
    let s = LessonScript::standard();
    let titles: Vec<String> = s.steps.iter().map(Step::title).collect();
    assert_eq!(
        titles,
        [
            "allocate a (1 B)",
            "allocate b (1000 B)",
            "allocate c (1572864 B)",
            "allocate big (104857600 B)",
            "free big",
            "allocate reuse (62914560 B)",
            "allocate odd (105906177 B)",
            "reset peaks",
            "allocate burst (268435456 B)",
            "free burst",
            "C = A·A, 1024×1024 float32",
            "free C",
            "C2 = A·A, 1024×1024 float32",
            "empty cache",
            "fill the cache with huge: 60.0% of the free memory, allocated and freed",
            "allocate more: free memory + half the releasable cache",
        ]
    );
    assert_eq!(
        s.steps.iter().filter(|s| s.is_relative()).count(),
        2,
        "only the last two are sized from the free memory"
    );
    assert!(s.steps[14].is_relative() && s.steps[15].is_relative());
}

#[test]
fn the_model_shows_the_retry_on_a_fixture() {
    let r = standard();
    assert_eq!(r.steps.len(), 17);
    let fill = &r.steps[15];
    let more = &r.steps[16];
    let before = &r.steps[14];
    let (h, m) = (fill.resolved.unwrap(), more.resolved.unwrap());
    // The cached block stays reserved; the request is more than free, less than free + cache.
    assert_eq!(fill.reading.reserved, before.reading.reserved + h.bytes);
    assert_eq!(fill.reading.allocated, before.reading.allocated);
    assert!(m.bytes > m.runtime_free && m.bytes < m.runtime_free + m.releasable);
    assert_eq!(more.stats.alloc_retries, before.stats.alloc_retries + 1);
    assert_eq!(
        more.reading.reserved,
        before.reading.reserved + m.bytes,
        "the cached segment was released before the new one"
    );
    assert_eq!(more.reading.allocated, before.reading.allocated + m.bytes);
    assert_eq!(r.exact_steps(), Some((17, 17)));
    assert!(r.prediction.is_some() && r.not_predicted.is_none());
}

#[test]
fn a_record_round_trips_through_json_and_bad_files_are_refused() {
    let r = standard();
    let text = serde_json::to_string_pretty(&r).unwrap();
    let back = LessonRecord::from_bytes(text.as_bytes(), "r.json").unwrap();
    assert_eq!(back, r);
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["schema"] = "iteragpu-lab/measurement/v1".into();
    let e = LessonRecord::from_bytes(v.to_string().as_bytes(), "r.json").unwrap_err();
    assert!(e.to_string().contains("is not a lesson record"), "{e}");
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["steps"].as_array_mut().unwrap().remove(0);
    assert!(LessonRecord::from_bytes(v.to_string().as_bytes(), "r.json").is_err());
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["steps"][3]["step"] = serde_json::json!({"op": "launch", "name": "x"});
    assert!(LessonRecord::from_bytes(v.to_string().as_bytes(), "r.json").is_err());
    assert!(LessonRecord::from_bytes(b"{}", "r.json").is_err());
}

fn view(lesson: &Shown<LessonRecord>, expandable: bool) -> LessonView<'_> {
    LessonView {
        shown: lesson,
        expandable,
    }
}

fn recorded_elsewhere(file: &Path, why: &str) -> Shown<LessonRecord> {
    Shown::recorded(file, why.into(), LessonRecord::load_recording)
}

#[test]
fn a_measured_lesson_shows_each_step_with_its_prediction() {
    let lesson = Shown::here(standard());
    let shown = view(&lesson, false);
    let h = shown.steps(2..=3).0;
    assert!(
        h.contains("MEASURED just now") && h.contains(FIXTURE_GPU),
        "{h}"
    );
    assert!(h.contains("2. allocate a (1 B)") && h.contains("3. allocate b (1000 B)"));
    assert!(!h.contains("4. allocate c"));
    assert!(h.contains("PREDICTED by the allocator model (compute capability 9.0"));
    assert!(h.contains("+512") && h.contains("+1024"));
    let map = shown.map(7).0;
    assert_eq!(
        map.matches("<svg").count(),
        2,
        "measured and predicted maps"
    );
    assert!(map.contains("after step 7: allocate reuse"));
    let summary = shown.summary(17).0;
    assert!(summary.contains("num_alloc_retries") && summary.contains("inactive split"));
    assert_eq!(
        summary.matches("<table").count(),
        2,
        "measured and predicted"
    );
    let chart = shown.chart().0;
    assert!(
        chart.contains("<svg") && chart.contains("at 17 of 17 steps"),
        "{chart}"
    );
    // Out of range: said, never a panic.
    assert!(shown.steps(40..=50).0.contains("none in 40..=50"));
    assert!(shown.map(0).0.contains("no step 0"));
    assert!(shown.summary(99).0.contains("no step 99"));
    let header = shown.header().0;
    assert!(header.contains("PYTORCH_CUDA_ALLOC_CONF: unset") && header.contains("Environment"));
    assert!(!header.contains(labels::RECORDED_ELSEWHERE) && !header.contains(labels::NO_GPU));
}

fn expandable_fixture() -> LessonRecord {
    model_record(
        16 << 30,
        &LessonScript::standard(),
        Some(EXPANDABLE_SEGMENTS.into()),
        AllocatorSettings {
            expandable_segments: true,
            parsed: EXPANDABLE_SEGMENTS.into(),
            ..default_settings()
        },
    )
}

#[test]
fn the_run_with_expandable_segments_is_predicted_too() {
    let r = expandable_fixture();
    assert!(r.prediction.is_some() && r.not_predicted.is_none());
    assert!(r
        .prediction
        .as_ref()
        .unwrap()
        .source
        .contains("expandable segments"));
    let lesson = Shown::here(r);
    let shown = view(&lesson, true);
    let h = shown.steps(1..=17).0;
    assert!(h.contains("PREDICTED"), "{h}");
    assert_eq!(
        shown.map(8).0.matches("<svg").count(),
        2,
        "the map measured and the map predicted"
    );
    assert!(shown.summary(8).0.contains("map_block"));
    let lessons = Lessons {
        default: Shown::here(standard()),
        expandable: lesson,
    };
    let c = lessons.compare(8).0;
    assert!(c.contains("alloc retries (expandable)") && c.contains("segments in the map"));
    assert_eq!(c.matches("<svg").count(), 2, "both maps after step 8");
    assert!(c.contains("17. allocate more: free memory + half the releasable cache"));
}

#[test]
fn a_recorded_lesson_is_labelled_with_its_environment_and_a_missing_one_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(RECORDED_DEFAULT);
    std::fs::write(&file, serde_json::to_vec(&standard()).unwrap()).unwrap();
    let recorded_lesson = recorded_elsewhere(&file, "no usable GPU here");
    let recorded = view(&recorded_lesson, false);
    let h = recorded.steps(2..=2).0;
    assert!(
        h.contains(labels::RECORDED_ELSEWHERE) && h.contains(RECORDED_DEFAULT),
        "{h}"
    );
    assert!(h.contains("PREDICTED"));
    let header = recorded.header().0;
    assert!(header.contains(labels::NO_GPU) && header.contains("no usable GPU here"));
    assert!(header.contains("Environment") && header.contains(FIXTURE_GPU));

    let missing_lesson =
        recorded_elsewhere(&dir.path().join(RECORDED_EXPANDABLE), "no usable GPU here");
    let missing = view(&missing_lesson, true);
    for h in [
        missing.header(),
        missing.steps(2..=3),
        missing.map(8),
        missing.summary(17),
        missing.chart(),
    ] {
        assert!(
            h.0.contains(labels::NO_GPU) && h.0.contains("cannot be shown"),
            "{}",
            h.0
        );
    }
    // The lesson with expandable segments missing: the model's prediction alone, labelled.
    let h = missing.steps(2..=3).0;
    assert!(
        h.contains("PREDICTED") && h.contains("expandable segments"),
        "{h}"
    );
    // The default lesson missing: the model's prediction alone, labelled, for the fixed steps.
    let missing_default_lesson = recorded_elsewhere(&dir.path().join("absent.json"), "no GPU");
    let missing_default = view(&missing_default_lesson, false);
    let h = missing_default.steps(2..=3).0;
    assert!(
        h.contains("PREDICTED") && h.contains("2. allocate a (1 B)"),
        "{h}"
    );
    assert!(missing_default.map(8).0.contains("<svg"));
    assert!(missing_default
        .steps(17..=17)
        .0
        .contains("no predicted step"));
    let lessons = Lessons {
        default: missing_default_lesson.clone(),
        expandable: missing_lesson.clone(),
    };
    assert!(lessons.compare(8).0.contains("cannot be shown"));
    assert!(lessons.header().0.contains("missing, not recorded yet"));
    // A file that is not a lesson: said, never shown.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, b"{\"schema\": \"iteragpu-lab/measurement/v1\"}").unwrap();
    let bad_lesson = recorded_elsewhere(&bad, "no GPU");
    let h = view(&bad_lesson, false).header().0;
    assert!(h.contains("is not a lesson record"), "{h}");
}

#[test]
fn a_model_lesson_needs_the_sizes_it_ran_with() {
    let mut r = standard();
    r.steps[16].resolved = None;
    assert!(r
        .model()
        .unwrap_err()
        .contains("sized from the free memory"));
    // A step of a fixed size is replayed as it is, on the recorded architecture.
    let mut r = standard();
    r.environment.device.as_mut().unwrap().compute_capability = "6.1".into();
    assert!(r.model().is_err());
    assert!(view(&Shown::here(r), false).steps(2..=2).0.contains("6.1"));
}

// The command line.

fn lesson_args(output: &Path) -> Vec<String> {
    vec![
        "lesson".into(),
        "--device".into(),
        "cuda:0".into(),
        "--output".into(),
        output.display().to_string(),
    ]
}

#[test]
fn without_a_gpu_or_its_companion_lesson_exits_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lesson.json");
    let front = common::copy_program("mesure_memoire", dir.path());
    Command::new(&front)
        .args(lesson_args(&out))
        .env_remove("IGL_COMPANION")
        .assert()
        .code(UNAVAILABLE)
        .stderr(contains("mesure_memoire_torch"))
        .stderr(contains("nothing was measured, no file written"));
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only the copied program"
    );
    // A companion that finds no GPU exits 2 (the libtorch crate's tests run the real one); the
    // front program passes its code through and writes nothing.
    expect_companion_exit(2, UNAVAILABLE);
}

/// The front program beside a stand-in companion that exits `code`: `lesson` exits `expected`.
fn expect_companion_exit(code: i32, expected: i32) {
    let dir = tempfile::tempdir().unwrap();
    let front = common::copy_program("mesure_memoire", dir.path());
    stand_in_companion(
        dir.path(),
        &format!("#!/bin/sh\necho 'mesure_memoire: error: no usable GPU' >&2\nexit {code}\n"),
    );
    let out = dir.path().join("lesson.json");
    Command::new(&front)
        .args(lesson_args(&out))
        .env_remove("IGL_COMPANION")
        .assert()
        .code(expected);
    assert!(!out.exists());
}

#[test]
fn lesson_refuses_an_existing_output_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lesson.json");
    std::fs::write(&out, "previous lesson").unwrap();
    for extra in [&[][..], &["--expandable-segments"][..]] {
        mm().args(lesson_args(&out))
            .args(extra)
            .env_remove("PYTORCH_CUDA_ALLOC_CONF")
            .assert()
            .code(OUTPUT_EXISTS)
            .stderr(contains("already exists"));
    }
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous lesson");
}

#[test]
fn expandable_segments_refuse_a_conflicting_alloc_conf_and_set_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lesson.json");
    for conflicting in ["expandable_segments:False", "max_split_size_mb:64"] {
        mm().args(lesson_args(&out))
            .arg("--expandable-segments")
            .env("PYTORCH_CUDA_ALLOC_CONF", conflicting)
            .assert()
            .code(USAGE)
            .stderr(contains(conflicting))
            .stderr(contains("does not merge"));
        assert!(!out.exists());
    }
    // What the front program hands the companion: a stand-in companion writes down the variable.
    let front = common::copy_program("mesure_memoire", dir.path());
    let seen = dir.path().join("seen");
    stand_in_companion(
        dir.path(),
        &format!(
            "#!/bin/sh\necho \"${{PYTORCH_CUDA_ALLOC_CONF-unset}}\" >> '{}'\nexit 2\n",
            seen.display()
        ),
    );
    let run = |extra: &[&str], conf: Option<&str>| {
        let mut c = Command::new(&front);
        c.args(lesson_args(&out))
            .args(extra)
            .env_remove("IGL_COMPANION");
        match conf {
            Some(v) => c.env("PYTORCH_CUDA_ALLOC_CONF", v),
            None => c.env_remove("PYTORCH_CUDA_ALLOC_CONF"),
        };
        c.assert().code(UNAVAILABLE);
    };
    run(&["--expandable-segments"], None);
    run(&["--expandable-segments"], Some(EXPANDABLE_SEGMENTS));
    run(&[], None);
    run(&[], Some("max_split_size_mb:64"));
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        "expandable_segments:True\nexpandable_segments:True\nunset\nmax_split_size_mb:64\n"
    );
    assert!(!out.exists());
}

/// A GPU that runs the lesson on the allocator model (a test fixture), handed to the command line
/// as the libtorch backend would be.
struct ModelGpu;

impl iteragpu_lab::gpu::Gpu for ModelGpu {
    fn environment(
        &self,
        device: Option<iteragpu_lab::device::CudaDevice>,
    ) -> iteragpu_lab::environment::EnvironmentReport {
        iteragpu_lab::environment::EnvironmentReport::without_libtorch(device, Default::default())
    }
    fn measure(
        &self,
        _config: &iteragpu_lab::measure::MeasureConfig,
        _blocks: bool,
        _on_phase: &mut dyn FnMut(&iteragpu_lab::measure::PhaseRecord),
    ) -> Result<iteragpu_lab::measure::Measurement, iteragpu_lab::measure::MeasureError> {
        Err(iteragpu_lab::measure::MeasureError::NoGpu(
            "a lesson fixture only".into(),
        ))
    }
    fn lesson(
        &self,
        _device: iteragpu_lab::device::CudaDevice,
        script: &LessonScript,
        configuration: Option<String>,
    ) -> Result<LessonRecord, iteragpu_lab::measure::MeasureError> {
        Ok(model_record(
            16 << 30,
            script,
            configuration,
            default_settings(),
        ))
    }
}

#[test]
fn the_gpu_process_writes_the_record_once_and_never_over_a_file() {
    use iteragpu_lab::cli::mesure_memoire::{run, Mode};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lesson.json");
    let mut line = lesson_args(&out);
    line.push("--quiet".into());
    let args = engine_args(line);
    run(&args, Mode::Companion(&ModelGpu)).unwrap();
    let r = LessonRecord::load(&out).unwrap();
    assert_eq!(r.steps.len(), 17);
    assert_eq!(r.allocator_configuration, None);
    let failure = run(&args, Mode::Companion(&ModelGpu)).unwrap_err();
    assert_eq!(common::code(failure.status), OUTPUT_EXISTS);
    assert_eq!(LessonRecord::load(&out).unwrap(), r, "untouched");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary file"
    );
}

#[test]
fn the_model_sizes_every_large_step_as_pytorch_does() {
    let r = standard();
    let delta = |i: usize, f: fn(&iteragpu_lab::reading::StepReading) -> u64| {
        f(&r.steps[i].reading) as i128 - f(&r.steps[i - 1].reading) as i128
    };
    assert_eq!(delta(3, |s| s.reserved), 20 * MIB as i128);
    assert_eq!(delta(7, |s| s.allocated), 102 * MIB as i128);
    assert_eq!(
        r.steps[10].reading.allocated, r.steps[8].reading.allocated,
        "the burst allocated and freed"
    );
    assert_eq!(delta(10, |s| s.reserved), 0);
}
