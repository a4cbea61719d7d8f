//! Mutation fuzzing of every parser of untrusted input: the catalog (`Catalog::parse`), the results
//! grid (`grid::check_bytes`), a measurement file (`Measurement::from_bytes`, then what `plot` does
//! with it), the bundle's manifest and zip (`bundle::verify` of a folder and of a zip), and the
//! allocator snapshot text (`allocator::snapshot::parse`), a lesson record
//! (`LessonRecord::from_bytes`, then what the notebook draws from it), a saved budget
//! (`BudgetFile::parse`, then for a workload of a few thousand tokens `BudgetFile::verify`, which
//! budgets it again, and its text; the seeds are files this version writes, and each input is also
//! tried with its figures moved between terms or added to one and its sums, which must be
//! refused), a presets file (`Presets::parse`, then each row's
//! model), a model's `config.json` (`model::config::parse`, then its parameters), a
//! safetensors file's header (`Checkpoint::add_header`) and a sweep folder's
//! `sweep.csv` (`Sweep::load`, then its text and chart).
//!
//! Each parser runs on the seed files of `tests/corpus/<parser>/` as they are, then on mutations
//! of them made by a seeded generator (bit flips, byte changes, insertions of random bytes and of
//! tokens the formats give meaning to, deletions, duplications, splices between two seed files,
//! truncations), and must neither panic nor take longer than [`LIMIT`] on any input. The same
//! seed gives the same inputs. An input that panics or hangs is saved into
//! `tests/corpus/<parser>/crashes/` (named by its SHA-256) and the test fails; saved inputs are
//! replayed first by every later run.
//!
//! `IGL_FUZZ_ITERATIONS` sets the number of mutated inputs per parser (default
//! [`DEFAULT_ITERATIONS`], a few seconds in a debug build), `IGL_FUZZ_SEED` the generator's seed;
//! `scripts/fuzz` runs it long, in release mode.

use iteragpu_lab::allocator::snapshot;
use iteragpu_lab::budget::{BudgetFile, Presets};
use iteragpu_lab::catalog::Catalog;
use iteragpu_lab::lesson::{LessonRecord, LessonView};
use iteragpu_lab::measure::Measurement;
use iteragpu_lab::shown::Shown;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Mutated inputs per parser when `IGL_FUZZ_ITERATIONS` is not set.
const DEFAULT_ITERATIONS: u64 = 2000;
/// The generator's seed when `IGL_FUZZ_SEED` is not set.
const DEFAULT_SEED: u64 = 0x1647_0b5e_ed00_2026;
/// The longest one input may take (a debug build on a loaded machine) before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(10);
/// Mutated inputs are cut at this size.
const MAX_LEN: usize = 1 << 20;

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v} is not a whole number"))
        }
    }
}

/// SplitMix64: small, fast, and the same sequence everywhere for one seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Byte strings the formats give meaning to (CSV, JSON, zip signatures, paths, the snapshot's
/// line kinds, numbers at the edges of the integer types), inserted whole.
const TOKENS: &[&[u8]] = &[
    b",",
    b"\"",
    b"\"\"",
    b"\n",
    b"\r\n",
    b"\r",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"0.0",
    b"1e308",
    b"-1e309",
    b"NaN",
    b"4294967296",
    b"18446744073709551615",
    b"18446744073709551616",
    b"99999999999999999999999999999999",
    b"\0",
    b"\xff\xfe",
    b"\xc3\xa9",
    b"\x1b[31m",
    b"PK\x03\x04",
    b"PK\x01\x02",
    b"PK\x05\x06",
    b"../",
    b"/etc/passwd",
    b"S ",
    b"B ",
    b" ",
    b"2026-02-29",
    b"published",
    b"MANIFEST.json",
];

/// One to four mutations of `input`; `corpus` gives the other half of a splice.
fn mutate(rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = out.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = [
                    0,
                    0xff,
                    0x7f,
                    0x80,
                    b'0',
                    b'9',
                    b'-',
                    b' ',
                    rng.next() as u8,
                ][rng.below(9)];
            }
            2 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                out.splice(at..at, bytes);
            }
            3 | 4 => {
                let at = rng.below(len + 1);
                let token = TOKENS[rng.below(TOKENS.len())];
                out.splice(at..at, token.iter().copied());
            }
            5 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(64)).min(len);
                out.drain(start..end);
            }
            6 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(256)).min(len);
                let copy = out[start..end].to_vec();
                let at = rng.below(len + 1);
                out.splice(at..at, copy);
            }
            7 => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => {
                out.truncate(rng.below(len + 1));
            }
        }
    }
    out.truncate(MAX_LEN);
    out
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// What the worker tells the watchdog after each input.
enum Report {
    Done { accepted: bool },
    Panicked { input: Vec<u8>, message: String },
}

/// Runs `parse` (true: the input was accepted) on the corpus of `parser` in `tests/corpus/` and on
/// mutations of it; fails on any panic or hang, saving the input, and unless the seeds are all
/// accepted and some mutations refused (else the parser was not really exercised).
fn fuzz(parser: &str, parse: impl Fn(&[u8]) -> bool + Send + 'static) {
    let run = Run {
        iterations: env_number("IGL_FUZZ_ITERATIONS", DEFAULT_ITERATIONS),
        seed: env_number("IGL_FUZZ_SEED", DEFAULT_SEED),
        limit: LIMIT,
    };
    fuzz_in(&Path::new(ROOT).join("tests/corpus"), parser, run, parse)
}

/// How long a fuzzing run is.
#[derive(Clone, Copy)]
struct Run {
    /// Mutated inputs.
    iterations: u64,
    /// The generator's seed.
    seed: u64,
    /// The longest one input may take.
    limit: Duration,
}

/// [`fuzz`] with the corpus folders under `corpus`.
fn fuzz_in(corpus: &Path, parser: &str, run: Run, parse: impl Fn(&[u8]) -> bool + Send + 'static) {
    let corpus_dir = corpus.join(parser);
    let seeds: Vec<Vec<u8>> = files_in(&corpus_dir)
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    fuzz_seeds(corpus, parser, seeds, run, parse)
}

/// [`fuzz_in`] from `seeds` given rather than read (files this version writes, made by the
/// test), the inputs that crash saved in the corpus folder all the same.
fn fuzz_seeds(
    corpus: &Path,
    parser: &str,
    seeds: Vec<Vec<u8>>,
    Run {
        iterations,
        seed,
        limit,
    }: Run,
    parse: impl Fn(&[u8]) -> bool + Send + 'static,
) {
    let corpus_dir = corpus.join(parser);
    let crash_dir = corpus_dir.join("crashes");
    assert!(
        !seeds.is_empty(),
        "no seed file in {}",
        corpus_dir.display()
    );
    let replays: Vec<Vec<u8>> = files_in(&crash_dir)
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    // Each parser has its own sequence (FNV-1a of its name mixed in), so that one parser's inputs
    // do not depend on another's.
    let name_hash = parser.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut rng = Rng(seed ^ name_hash);

    let current = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let worker = {
        let current = Arc::clone(&current);
        let (seeds, replays) = (seeds.clone(), replays.clone());
        std::thread::spawn(move || {
            let fixed = replays.into_iter().chain(seeds.iter().cloned());
            let mutated = (0..iterations).map(|_| {
                let base = &seeds[rng.below(seeds.len())];
                mutate(&mut rng, base, &seeds)
            });
            for input in fixed.chain(mutated) {
                current.lock().unwrap().clone_from(&input);
                let report = match catch_unwind(AssertUnwindSafe(|| parse(&input))) {
                    Ok(accepted) => Report::Done { accepted },
                    Err(payload) => Report::Panicked {
                        message: payload
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default(),
                        input,
                    },
                };
                if tx.send(report).is_err() {
                    return;
                }
            }
        })
    };

    let save = |prefix: &str, input: &[u8]| -> PathBuf {
        std::fs::create_dir_all(&crash_dir).unwrap();
        let hash = iteragpu_lab::sha256_hex(input);
        let path = crash_dir.join(format!("{prefix}{}", &hash[..16]));
        std::fs::write(&path, input).unwrap();
        path
    };
    let started = Instant::now();
    let (mut n, mut accepted) = (0u64, Vec::new());
    let mut crashes = Vec::new();
    loop {
        match rx.recv_timeout(limit) {
            Ok(Report::Done { accepted: ok }) => accepted.push(ok),
            Ok(Report::Panicked { input, message }) => {
                accepted.push(false);
                crashes.push(format!("{} ({message})", save("", &input).display()));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let input = current.lock().unwrap().clone();
                let path = save("hang-", &input);
                panic!(
                    "{parser}: input {n} still running after {limit:?} (IGL_FUZZ_SEED={seed:#x}); \
                     saved as {}",
                    path.display()
                );
            }
        }
        n += 1;
    }
    worker.join().expect("the worker itself does not panic");
    println!(
        "fuzz {parser}: {n} inputs ({} seeds, {} replayed, {iterations} mutated, seed {seed:#x}) in \
         {:.1} s, {} accepted",
        seeds.len(),
        replays.len(),
        started.elapsed().as_secs_f64(),
        accepted.iter().filter(|a| **a).count()
    );
    assert!(
        crashes.is_empty(),
        "{parser}: {} input(s) panicked (IGL_FUZZ_SEED={seed:#x}), saved:\n{}",
        crashes.len(),
        crashes.join("\n")
    );
    assert_eq!(n, (replays.len() + seeds.len()) as u64 + iterations);
    let seeds_accepted = &accepted[replays.len()..replays.len() + seeds.len()];
    assert!(
        seeds_accepted.iter().all(|a| *a),
        "{parser}: every seed file must be valid, so that mutations start from real input: {seeds_accepted:?}"
    );
    if iterations >= 50 {
        assert!(
            accepted[replays.len() + seeds.len()..].iter().any(|a| !a),
            "{parser}: no mutated input was refused: the parser is not reached"
        );
    }
}

#[test]
fn the_generator_is_deterministic_and_mutates() {
    let corpus = vec![
        b"model,display_name\nh200,NVIDIA H200\n".to_vec(),
        b"{}".to_vec(),
    ];
    let run = |seed| {
        let mut rng = Rng(seed);
        (0..200)
            .map(|i| mutate(&mut rng, &corpus[i % 2], &corpus))
            .collect::<Vec<_>>()
    };
    let a = run(7);
    assert_eq!(a, run(7));
    assert_ne!(a, run(8));
    let changed = a
        .iter()
        .enumerate()
        .filter(|(i, m)| **m != corpus[i % 2])
        .count();
    assert!(changed > 150, "{changed} of 200 inputs changed");
    assert!(a.iter().any(|m| m.len() > corpus[0].len()));
    assert!(a.iter().any(|m| m.len() < corpus[1].len()));
}

/// The runs that check the harness itself, whatever the environment asks.
const HARNESS_RUN: Run = Run {
    iterations: 300,
    seed: DEFAULT_SEED,
    limit: LIMIT,
};

/// A corpus folder holding one seed, for checks of the harness itself.
fn one_seed_corpus() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("check")).unwrap();
    std::fs::write(dir.path().join("check/seed.txt"), "a valid line\n").unwrap();
    dir
}

/// The run's failure message.
fn failure_of(run: impl FnOnce() + Send + 'static) -> String {
    let payload = std::thread::spawn(run).join().expect_err("the run fails");
    payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default()
}

/// The harness itself: a parser that panics on some inputs is caught, and those inputs saved.
#[test]
fn a_panicking_parser_fails_the_run_and_its_inputs_are_saved() {
    let corpus = one_seed_corpus();
    let root = corpus.path().to_path_buf();
    let message = failure_of(move || {
        // Some of the generator's 300 inputs from this seed hold a NUL byte, most do not.
        fuzz_in(&root, "check", HARNESS_RUN, |input| {
            assert!(!input.contains(&0), "a NUL byte");
            input == b"a valid line\n"
        })
    });
    assert!(message.contains("input(s) panicked"), "{message}");
    let saved = files_in(&corpus.path().join("check/crashes"));
    assert!(!saved.is_empty());
    assert!(saved.iter().all(|p| std::fs::read(p).unwrap().contains(&0)));
}

/// The harness itself: a parser that does not return in time fails the run, its input saved.
#[test]
fn a_hanging_parser_fails_the_run_and_its_input_is_saved() {
    let corpus = one_seed_corpus();
    let root = corpus.path().to_path_buf();
    let message = failure_of(move || {
        let run = Run {
            limit: Duration::from_millis(300),
            ..HARNESS_RUN
        };
        fuzz_in(&root, "check", run, |input| {
            if input != b"a valid line\n" {
                std::thread::sleep(Duration::from_secs(2));
            }
            true
        })
    });
    assert!(message.contains("still running after 300ms"), "{message}");
    let saved = files_in(&corpus.path().join("check/crashes"));
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert!(saved[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("hang-"));
}

#[test]
fn catalog() {
    fuzz("catalog", |bytes| match Catalog::parse(bytes, "fuzz.csv") {
        Ok(c) => {
            let _ = c.to_string();
            for model in c.models() {
                for days in [3, 7, 30] {
                    let order = iteragpu_lab::quote::Order {
                        gpu: &model,
                        days,
                        lots: 2,
                        accepted_results: Some(3),
                    };
                    let _ = c.quote(&order).map(|q| q.to_string());
                }
            }
            true
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    });
}

#[test]
fn grid() {
    fuzz("grid", |bytes| {
        let report = iteragpu_lab::grid::check_bytes(bytes, "fuzz.csv");
        let _ = report.to_string();
        report.problems.is_empty()
    });
}

#[test]
fn measurement() {
    fuzz("measurement", |bytes| {
        match Measurement::from_bytes(bytes, "fuzz.json") {
            // What `mesure_memoire plot` and the notebooks do with a measurement read from a file.
            Ok(m) => {
                let _ = m.to_string();
                let _ = m.chart();
                true
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        }
    });
}

#[test]
fn lesson() {
    fuzz("lesson", |bytes| {
        match LessonRecord::from_bytes(bytes, "fuzz.json") {
            // What `mesure_memoire lesson` prints and the notebook shows of a recorded lesson.
            Ok(r) => {
                let _ = r.to_string();
                let lesson = Shown::here(r);
                let shown = LessonView {
                    shown: &lesson,
                    expandable: false,
                };
                let _ = shown.header();
                let _ = shown.steps(1..=40);
                let _ = shown.map(8);
                let _ = shown.summary(17);
                let _ = shown.chart();
                true
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        }
    });
}

#[test]
fn snapshot() {
    let names = HashMap::from([
        (280_375_429_431_296, "cublas_workspace".to_string()),
        (1000, "linear1.weight".to_string()),
    ]);
    fuzz("snapshot", move |bytes| {
        snapshot::parse(&String::from_utf8_lossy(bytes), &names)
            .map(|(map, _)| snapshot::allocated_bytes(&map))
            .is_ok()
    });
}

/// The seed bundle, extracted: (the temporary folder, the bundle's top folder in it).
fn extracted_bundle() -> (tempfile::TempDir, PathBuf) {
    let zip = files_in(&Path::new(ROOT).join("tests/corpus/zip"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "zip"))
        .expect("a seed zip");
    let mut archive = zip::ZipArchive::new(std::fs::File::open(zip).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut top = None;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).unwrap();
        let name = entry.enclosed_name().expect("a safe seed");
        let path = dir.path().join(&name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut out = std::fs::File::create(&path).unwrap();
        std::io::copy(&mut entry, &mut out).unwrap();
        if let Some(mode) = entry.unix_mode() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o777)).unwrap();
        }
        top.get_or_insert_with(|| dir.path().join(name.components().next().unwrap()));
    }
    let top = top.expect("a non-empty seed zip");
    (dir, top)
}

#[test]
fn manifest() {
    // The seed bundle's files, with each input as their MANIFEST.json.
    let (dir, top) = extracted_bundle();
    fuzz("manifest", move |bytes| {
        let _keep = &dir;
        std::fs::write(top.join("MANIFEST.json"), bytes).unwrap();
        matches!(iteragpu_lab::bundle::verify(&top), Ok(v) if v.ok())
    });
}

#[test]
fn zip() {
    let dir = tempfile::tempdir().unwrap();
    fuzz("zip", move |bytes| {
        let path = dir.path().join("bundle.zip");
        std::fs::write(&path, bytes).unwrap();
        match iteragpu_lab::bundle::verify(&path) {
            Ok(v) => {
                let _ = v.to_string();
                v.ok()
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        }
    });
}

/// Whether a workload replays in well under a second in a debug build.
fn small(w: &iteragpu_lab::budget::Workload) -> bool {
    let generated = match w.mode {
        iteragpu_lab::budget::Mode::Inference { generated } => generated,
        _ => 0,
    };
    w.batch * w.tokens() <= 4096 && generated <= 64 && w.model.layers.len() <= 32
}

/// Budget files this version writes: inference and LoRA of small models.
fn budget_seeds() -> Vec<Vec<u8>> {
    use iteragpu_lab::budget::{budget, BudgetSettings, Mode, Workload};
    let small = |preset: &str, mode: Mode| {
        let w = Workload {
            mode,
            context: 64,
            ..Workload::preset(preset).unwrap()
        }
        .validated()
        .unwrap();
        serde_json::to_vec_pretty(&budget(&w, &BudgetSettings::h200())).unwrap()
    };
    vec![
        small("llama-3.2-1b", Mode::Inference { generated: 4 }),
        small(
            "qwen2.5-0.5b",
            Mode::Lora {
                rank: 8,
                targets: vec!["q_proj".into(), "v_proj".into()],
            },
        ),
    ]
}

/// A budget file's figures moved without breaking any sum: `delta` bytes taken from one term
/// and given to another, or added to one term with the peaks, totals and needs that hold it.
fn consistent_edit(value: &serde_json::Value, rng: u64) -> Option<serde_json::Value> {
    let mut v = value.clone();
    let terms = v.get_mut("terms")?.as_array_mut()?;
    let n = terms.len();
    if n < 2 {
        return None;
    }
    let (a, b) = ((rng % n as u64) as usize, ((rng >> 8) % n as u64) as usize);
    let delta = 1 + (rng >> 16) % (1 << 40);
    let take = |t: &mut serde_json::Value, by: i128| -> Option<()> {
        for key in ["bytes", "at_peak"] {
            let x = t.get_mut(key)?.get_mut("bytes")?;
            *x = u64::try_from(i128::from(x.as_u64()?) + by).ok()?.into();
        }
        Some(())
    };
    if a != b {
        take(&mut terms[a], -i128::from(delta))?;
        take(&mut terms[b], i128::from(delta))?;
    } else {
        take(&mut terms[a], i128::from(delta))?;
        for key in ["total", "needed", "peak_reserved"] {
            let x = v.get_mut(key)?.get_mut("bytes")?;
            *x = x.as_u64()?.checked_add(delta)?.into();
        }
    }
    Some(v)
}

#[test]
fn budget() {
    let run = Run {
        iterations: env_number("IGL_FUZZ_ITERATIONS", DEFAULT_ITERATIONS),
        seed: env_number("IGL_FUZZ_SEED", DEFAULT_SEED),
        limit: LIMIT,
    };
    let corpus = Path::new(ROOT).join("tests/corpus");
    fuzz_seeds(&corpus, "budget", budget_seeds(), run, |bytes| {
        // Whatever the input, the same file with its sums kept and its terms moved is refused.
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
            let rng = iteragpu_lab::sha256_hex(bytes);
            let rng = u64::from_str_radix(&rng[..16], 16).unwrap();
            if let Some(edited) = consistent_edit(&value, rng) {
                let text = serde_json::to_vec(&edited).unwrap();
                if let Ok(f) = BudgetFile::parse(&text, "fuzz.json") {
                    if small(f.workload()) {
                        assert!(f.verify().is_err(), "a consistent edit was accepted");
                    }
                }
            }
        }
        match BudgetFile::parse(bytes, "fuzz.json") {
            // Budgeting a workload again takes the time of its replay: only the small ones are
            // (the mutations of the seeds' numbers reach any size the bounds allow).
            Ok(f) if small(f.workload()) => match f.verify() {
                // What `calcul_forfaits --fit` prints of a budget file before planning it.
                Ok(b) => {
                    let _ = b.to_string();
                    true
                }
                Err(e) => {
                    let _ = e.to_string();
                    false
                }
            },
            Ok(_) => true,
            Err(e) => {
                let _ = e.to_string();
                false
            }
        }
    });
}

#[test]
fn presets() {
    fuzz("presets", |bytes| match Presets::parse(bytes, "fuzz.csv") {
        Ok(p) => {
            let _ = p.to_string();
            p.rows.iter().all(|row| row.model().is_ok())
        }
        Err(e) => {
            let _ = e.to_string();
            false
        }
    });
}

#[test]
fn model_config() {
    fuzz(
        "model-config",
        |bytes| match iteragpu_lab::model::config::parse(bytes) {
            Ok(model) => {
                let _ = model.parameter_count();
                model.check_runnable().is_ok()
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        },
    );
}

#[test]
fn safetensors() {
    // A whole file: its 8-byte header length, the header, then the tensors' data.
    fuzz("safetensors", |bytes| {
        let mut c = iteragpu_lab::model::folder::Checkpoint::empty();
        let Some((length, rest)) = bytes.split_first_chunk::<8>() else {
            return false;
        };
        let n = u64::from_le_bytes(*length);
        if n > rest.len() as u64 {
            return false;
        }
        let (header, data) = rest.split_at(n as usize);
        c.add_header(header, data.len() as u64).is_ok()
    });
}

#[test]
fn sweep() {
    // Each input is the `sweep.csv` of a folder holding the recorded sweep's summary.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        Path::new(ROOT).join("data/exemple-balayage-h200/sweep.json"),
        dir.path().join("sweep.json"),
    )
    .unwrap();
    fuzz("sweep", move |bytes| {
        std::fs::write(dir.path().join("sweep.csv"), bytes).unwrap();
        match iteragpu_lab::sweep::Sweep::load(dir.path()) {
            Ok(s) => {
                let _ = s.to_string();
                let _ = iteragpu_lab::plot::sweep_chart(&s);
                true
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        }
    });
}
