//! The documents say what the code does, and stay so: every repository path that README.md,
//! ARCHITECTURE.md, SECURITY.md, scripts/README.md and docs/*.md name exists; ARCHITECTURE.md maps
//! every source file; scripts/README.md lists every script; docs/cli.md's exit-code table is `Status::ALL`; docs/measurement-schema.md lists exactly the keys a
//! measurement's JSON has; the figures docs/benchmarks.md quotes from recorded runs are those
//! runs'; the notebooks and docs/notebooks.md give the same warm start time.

use iteragpu_lab::measure::Measurement;
use iteragpu_lab::status::Status;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The documents checked, relative to the repository root.
fn documents() -> Vec<String> {
    let mut docs: Vec<String> = [
        "README.md",
        "ARCHITECTURE.md",
        "SECURITY.md",
        "scripts/README.md",
    ]
    .map(String::from)
    .to_vec();
    let mut more: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    more.sort();
    assert!(more.len() >= 3, "docs/*.md: {more:?}");
    docs.extend(more);
    docs
}

/// The text with fenced code blocks blanked (their lines kept, so line numbers stay right).
fn prose(text: &str) -> String {
    let mut fenced = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return "";
            }
            if fenced {
                ""
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Inline code spans (single backticks) with the line each starts on.
fn code_spans(text: &str) -> Vec<(usize, String)> {
    let text = prose(text);
    let mut spans = Vec::new();
    let mut rest = text.as_str();
    let mut line = 1;
    while let Some(start) = rest.find('`') {
        line += rest[..start].matches('\n').count();
        let after = &rest[start + 1..];
        let Some(end) = after.find('`') else { break };
        spans.push((line, after[..end].to_string()));
        line += after[..end].matches('\n').count();
        rest = &after[end + 1..];
    }
    spans
}

/// Markdown link targets `](target)` with their line.
fn links(text: &str) -> Vec<(usize, String)> {
    let text = prose(text);
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].to_string()));
            rest = &after[end + 1..];
        }
    }
    out
}

/// Extensions that make a code span a file name.
const EXTENSIONS: [&str; 15] = [
    "md", "rs", "py", "csv", "json", "ipynb", "sh", "txt", "toml", "lock", "h", "cpp", "svg",
    "zip", "yml",
];

/// Whether a code span names a repository path to check. Not checked: anything with spaces
/// (commands, prose), placeholders and globs (`<`, `*`, `$`, `[]`), absolute and home paths, values
/// with `:` (devices, URLs), and files under `results/` (written by `scripts/lab`).
fn is_path_candidate(span: &str) -> bool {
    if span.is_empty()
        || span.chars().any(char::is_whitespace)
        || span.contains([
            '<', '>', '*', '?', '$', '[', ']', ':', '=', '|', '(', ')', ',',
        ])
        || span.starts_with(['/', '~', '-'])
        || span.starts_with("results/")
    {
        return false;
    }
    span.contains('/')
        || span
            .rsplit_once('.')
            .is_some_and(|(_, e)| EXTENSIONS.contains(&e))
}

/// `a/{b,c}` → `a/b`, `a/c` (one brace group); anything else as it is.
fn expand_braces(span: &str) -> Vec<String> {
    match (span.find('{'), span.find('}')) {
        (Some(open), Some(close)) if open < close => span[open + 1..close]
            .split(',')
            .map(|alt| format!("{}{alt}{}", &span[..open], &span[close + 1..]))
            .collect(),
        _ => vec![span.to_string()],
    }
}

/// A code span that looks like a path but is not one of this repository's, or that names a file by
/// a short name: where it is allowed, what it stands for, and why. Every entry must still be used.
struct Allowed {
    /// The code span, exactly.
    span: &'static str,
    /// The document that uses it.
    doc: &'static str,
    /// The repository path a short name stands for (it must exist); `None`: not a path here.
    means: Option<&'static str>,
    why: &'static str,
}

const fn allowed(
    span: &'static str,
    doc: &'static str,
    means: Option<&'static str>,
    why: &'static str,
) -> Allowed {
    Allowed {
        span,
        doc,
        means,
        why,
    }
}

const README: &str = "README.md";
const SECURITY: &str = "SECURITY.md";
const CONFIG: &str = "the file of a model's repository that transformers reads its sizes from";
const GENERATION: &str = "the file of a model's repository that generate takes its defaults from";
const CLI: &str = "docs/cli.md";
const NOTEBOOKS: &str = "docs/notebooks.md";
const ARCHITECTURE: &str = "ARCHITECTURE.md";
const MODEL: &str = "docs/allocator-model.md";
const PYTORCH: &str = "a file of PyTorch's source, cited with its version";

const SCRIPTS: &str = "scripts/README.md";
const BENCHMARKS: &str = "docs/benchmarks.md";

const ALLOWED: [Allowed; 33] = [
    allowed(
        "proof.json",
        SCRIPTS,
        None,
        "the file `gpu/hf-proof.py` writes in the folder its user names",
    ),
    allowed(
        "config.json",
        BENCHMARKS,
        None,
        "the file of each model's public repository the proof's models are built from",
    ),
    allowed(
        "FOLDER/sweep.csv",
        CLI,
        None,
        "the rows a sweep writes in the folder its user names",
    ),
    allowed(
        "sweep.json",
        CLI,
        None,
        "the summary a sweep writes beside its rows",
    ),
    allowed(
        "NAME.zip",
        CLI,
        None,
        "the zip `paquet_lab build` writes, named after `--name`",
    ),
    allowed(
        "INTO/NAME",
        CLI,
        None,
        "the folder `paquet_lab extract` writes",
    ),
    allowed(
        "MANIFEST.json",
        CLI,
        None,
        "a member of the bundle, written by `paquet_lab build`",
    ),
    allowed(
        ".resultats-bruts.csv.lock",
        CLI,
        None,
        "the lock file `append` creates beside a grid",
    ),
    allowed(
        "iteragpu-lab/measurement/v1",
        "docs/measurement-schema.md",
        None,
        "the schema tag",
    ),
    allowed("c10/cuda/CUDACachingAllocator.cpp", MODEL, None, PYTORCH),
    allowed("c10/core/AllocatorConfig.h", MODEL, None, PYTORCH),
    allowed(
        "aten/src/ATen/cuda/CublasHandlePool.cpp",
        MODEL,
        None,
        PYTORCH,
    ),
    allowed("aten/src/ATen/native/cuda/Blas.cpp", MODEL, None, PYTORCH),
    allowed(
        "mesure-memoire.ipynb",
        NOTEBOOKS,
        Some("notebooks/mesure-memoire.ipynb"),
        "in the notebooks' list",
    ),
    allowed(
        "allocated-vs-reserved.ipynb",
        NOTEBOOKS,
        Some("notebooks/allocated-vs-reserved.ipynb"),
        "in the notebooks' list",
    ),
    allowed(
        "budget-vram.ipynb",
        NOTEBOOKS,
        Some("notebooks/budget-vram.ipynb"),
        "in the notebooks' list",
    ),
    allowed(
        "config.json",
        CLI,
        None,
        "the file of each model's public repository that a row of data/modeles.csv names",
    ),
    allowed(
        "exemple-mesure-h200-petit-essai.json",
        ARCHITECTURE,
        Some("data/exemple-mesure-h200-petit-essai.json"),
        "in the layout's `data/` row",
    ),
    allowed(
        "csrc/",
        ARCHITECTURE,
        Some("torch/csrc/"),
        "in the layout's `torch/` row",
    ),
    allowed(
        "ffi.rs",
        ARCHITECTURE,
        Some("torch/src/ffi.rs"),
        "in the layout's `torch/` row",
    ),
    allowed("generation_config.json", ARCHITECTURE, None, GENERATION),
    allowed("generation_config.json", CLI, None, GENERATION),
    allowed("generation_config.json", README, None, GENERATION),
    allowed("config.json", README, None, CONFIG),
    allowed("config.json", ARCHITECTURE, None, CONFIG),
    allowed("config.json", SECURITY, None, CONFIG),
    allowed("config.json", NOTEBOOKS, None, CONFIG),
    allowed(
        "c10/cuda/CUDACachingAllocator.cpp",
        ARCHITECTURE,
        None,
        PYTORCH,
    ),
    allowed("c10/core/AllocatorConfig.h", ARCHITECTURE, None, PYTORCH),
    allowed(
        "aten/src/ATen/cuda/CublasHandlePool.cpp",
        ARCHITECTURE,
        None,
        PYTORCH,
    ),
    allowed("ATen/native/cuda/Reduce.cuh", ARCHITECTURE, None, PYTORCH),
    allowed(
        "MANIFEST.json",
        ARCHITECTURE,
        None,
        "a member of the bundle, written by `paquet_lab build`",
    ),
    allowed(
        "allocated-vs-reserved.ipynb",
        CLI,
        Some("notebooks/allocated-vs-reserved.ipynb"),
        "the notebook the lesson belongs to",
    ),
];

/// Whether `rel` exists relative to the repository root or to the document's folder.
fn exists(doc: &str, rel: &str) -> bool {
    let folder = Path::new(doc).parent().unwrap_or(Path::new(""));
    [
        PathBuf::from(ROOT).join(rel),
        Path::new(ROOT).join(folder).join(rel),
    ]
    .iter()
    .any(|p| p.exists())
}

#[test]
fn every_path_the_documents_name_exists() {
    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        for (line, span) in code_spans(&text) {
            let paths = expand_braces(&span);
            if !paths.iter().all(|p| is_path_candidate(p)) {
                continue;
            }
            if let Some(i) = ALLOWED.iter().position(|a| a.span == span && a.doc == doc) {
                used.insert(i);
                if let Some(real) = ALLOWED[i].means {
                    if !Path::new(ROOT).join(real).exists() {
                        missing.push(format!(
                            "{doc}:{line}: `{span}` (meaning {real}, {})",
                            ALLOWED[i].why
                        ));
                    }
                }
                continue;
            }
            for path in paths {
                checked += 1;
                if !exists(&doc, &path) {
                    missing.push(format!("{doc}:{line}: `{path}`"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named but absent:\n{}",
        missing.join("\n")
    );
    let unused: Vec<_> = ALLOWED
        .iter()
        .enumerate()
        .filter(|(i, _)| !used.contains(i))
        .map(|(_, a)| format!("`{}` in {} ({})", a.span, a.doc, a.why))
        .collect();
    assert!(
        unused.is_empty(),
        "allowlist entries no document uses any more: {unused:?}"
    );
    assert!(
        checked > 50,
        "only {checked} paths checked: the scan is broken"
    );
}

/// The anchors a Markdown file offers: its headings, as GitHub makes them.
fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
fn every_link_of_the_documents_leads_somewhere() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        let folder = Path::new(&doc).parent().unwrap().to_path_buf();
        for (line, target) in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            checked += 1;
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() {
                Path::new(&doc).to_path_buf()
            } else {
                folder.join(file)
            };
            let full = Path::new(ROOT).join(&path);
            if !full.exists() {
                broken.push(format!("{doc}:{line}: {target} (no {})", path.display()));
            } else if !anchor.is_empty()
                && !anchors(&std::fs::read_to_string(&full).unwrap()).contains(anchor)
            {
                broken.push(format!("{doc}:{line}: {target} (no heading #{anchor})"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked > 10, "only {checked} links checked");
}

#[test]
fn the_heading_anchors_are_made_as_github_makes_them() {
    let a = anchors("# A\n## `mesure_memoire estimate`\n### From measurement to decision: `x` and `y`\n```\n# not a heading\n```\n");
    let expected: BTreeSet<String> = [
        "a",
        "mesure_memoire-estimate",
        "from-measurement-to-decision-x-and-y",
    ]
    .map(String::from)
    .into();
    assert_eq!(a, expected);
}

/// Every script is listed in scripts/README.md, and every script it lists exists.
#[test]
fn scripts_readme_lists_every_script() {
    let text = read("scripts/README.md");
    let listed: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect();
    let mut present = BTreeSet::new();
    let mut stack = vec![PathBuf::from(ROOT).join("scripts")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "__pycache__" {
                    stack.push(p);
                }
            } else if name != "README.md" && !name.ends_with(".pyc") {
                let rel = p.strip_prefix(Path::new(ROOT).join("scripts")).unwrap();
                present.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    let unlisted: Vec<_> = present.difference(&listed).collect();
    let absent: Vec<_> = listed.difference(&present).collect();
    assert!(
        unlisted.is_empty(),
        "scripts missing from scripts/README.md: {unlisted:?}"
    );
    assert!(
        absent.is_empty(),
        "scripts/README.md lists absent scripts: {absent:?}"
    );
    assert!(
        present.contains("fuzz") && present.contains("gpu/proof.py"),
        "{present:?}"
    );
}

/// The rows of the Markdown table that follows `heading` in `text`, each as its cells.
fn table_after(text: &str, heading: &str) -> Vec<Vec<String>> {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("no `{heading}`"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn the_exit_code_table_is_the_programs_own() {
    let rows = table_after(&read(CLI), "## Exit codes");
    let documented: Vec<u8> = rows
        .iter()
        .map(|r| r[0].parse().unwrap_or_else(|_| panic!("not a code: {r:?}")))
        .collect();
    let codes: Vec<u8> = Status::ALL.iter().map(|s| s.code()).collect();
    assert_eq!(documented, codes);
    assert!(
        rows.iter().all(|r| r.len() == 2 && !r[1].is_empty()),
        "{rows:?}"
    );
}

/// The example measurement's JSON with what a measurement may also hold: the allocator model's
/// prediction (attached here for the recorded H200 run, as `measure` does) and a block map
/// (`measure --blocks`, needs a GPU: empty maps here).
/// The measurement recorded on the H200 with `--blocks`: every optional key present (the
/// prediction, the block maps, the free memory at start, the model's verdict).
fn full_measurement() -> Value {
    let bytes = read("data/exemple-mesure-h200-blocs.json");
    let m = Measurement::from_bytes(bytes.as_bytes(), "example").unwrap();
    assert!(
        m.model.as_ref().is_some_and(|x| x.not_predicted.is_none()),
        "{:?}",
        m.model
    );
    assert!(m
        .phases
        .iter()
        .all(|p| p.blocks.is_some() && p.prediction.is_some()));
    assert!(m.runtime_free_at_start_bytes.is_some());
    serde_json::to_value(&m).unwrap()
}

/// Every key path of `v` below `path`: `a.b`, `phases[].phase`.
fn key_paths(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                out.insert(p.clone());
                key_paths(x, &p, out);
            }
        }
        Value::Array(a) => {
            for x in a {
                let p = format!("{path}[]");
                if x.is_object() || x.is_array() {
                    out.insert(p.clone());
                }
                key_paths(x, &p, out);
            }
        }
        _ => {}
    }
}

/// The fields docs/measurement-schema.md documents, as full key paths: the first cell of each row
/// of its field tables; `.x` after `a.b` means `a.x`; the `environment` section's fields are under
/// `environment`.
fn documented_fields() -> BTreeSet<String> {
    let text = read("docs/measurement-schema.md");
    let mut out = BTreeSet::new();
    let mut prefix = "";
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with("## `environment`") {
            prefix = "environment.";
        }
        if line.starts_with("| field | meaning |") {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table || line.starts_with("| ---") {
            continue;
        }
        let first = line.trim_matches('|').split('|').next().unwrap();
        let mut last = String::new();
        for (_, span) in code_spans(first) {
            let full = match span.strip_prefix('.') {
                Some(rel) => {
                    let parent = last.rsplit_once('.').map_or("", |(p, _)| p);
                    format!("{parent}.{rel}")
                }
                None => format!("{prefix}{span}"),
            };
            last = full.clone();
            out.insert(full);
        }
    }
    out
}

fn is_below(ancestor: &str, path: &str) -> bool {
    path.strip_prefix(ancestor)
        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// What the schema document and the JSON disagree on: documented fields absent from the JSON, and
/// keys of the JSON that are not documented, not inside a documented value (a field the document
/// does not break down, such as `total_memory`'s bytes/GiB/GB) and lead to no documented field.
/// Where the document breaks an object down, it must list all its keys.
fn schema_mismatches(
    documented: &BTreeSet<String>,
    keys: &BTreeSet<String>,
) -> (Vec<String>, Vec<String>) {
    let absent = documented.difference(keys).cloned().collect();
    let has_documented_below = |p: &str| documented.iter().any(|d| is_below(p, d));
    let undocumented = keys
        .iter()
        .filter(|k| !documented.contains(*k) && !has_documented_below(k))
        .filter(|k| {
            !documented
                .iter()
                .any(|d| is_below(d, k) && !has_documented_below(d))
        })
        .cloned()
        .collect();
    (absent, undocumented)
}

#[test]
fn the_schema_document_lists_exactly_the_keys_of_a_measurement() {
    let documented = documented_fields();
    let mut keys = BTreeSet::new();
    key_paths(&full_measurement(), "", &mut keys);
    let (absent, undocumented) = schema_mismatches(&documented, &keys);
    assert!(absent.is_empty(), "documented, not in the JSON: {absent:?}");
    assert!(
        undocumented.is_empty(),
        "in the JSON, not documented: {undocumented:?}"
    );
}

#[test]
fn the_schema_check_finds_a_missing_or_an_extra_key() {
    let documented = documented_fields();
    for key in [
        "schema",
        "measured_at",
        "environment.device.index",
        "environment.device.runtime_total",
        "synthetic_model.dtype",
        "phases[].repetition",
        "phases[].prediction.residual",
        "phases[].blocks.at_peak",
        "model.rows",
        "environment.libtorch.cudnn_runtime",
    ] {
        assert!(documented.contains(key), "{key}: {documented:?}");
    }
    assert!(documented.len() > 60, "{documented:?}");
    let mut keys = BTreeSet::new();
    key_paths(&full_measurement(), "", &mut keys);
    // A new key in a broken-down object is caught; one inside a documented value is not a field.
    let mut more = keys.clone();
    more.insert("configuration.seed".into());
    more.insert("environment.device.total_memory.tib".into());
    assert_eq!(
        schema_mismatches(&documented, &more),
        (vec![], vec!["configuration.seed".to_string()])
    );
    // A field the document forgets, or documents without the JSON having it.
    let mut fewer = documented.clone();
    fewer.remove("synthetic_model.dtype");
    fewer.insert("phases[].passes_done".into());
    assert_eq!(
        schema_mismatches(&fewer, &keys),
        (
            vec!["phases[].passes_done".to_string()],
            vec!["synthetic_model.dtype".to_string()]
        )
    );
}

/// The README names the top-level keys of a measurement: exactly those.
#[test]
fn the_command_reference_names_the_top_level_keys_of_a_measurement() {
    let text = read(CLI);
    let start = text
        .find("The JSON (")
        .expect("the README's sentence on the JSON");
    let list = &text[start..start + text[start..].find(')').unwrap()];
    let named: BTreeSet<String> = code_spans(list).into_iter().map(|(_, s)| s).collect();
    let keys: BTreeSet<String> = full_measurement()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(named, keys);
}

/// docs/benchmarks.md quotes the recorded proof: its count of compared rows and figures is the sum
/// of the proof's comparison table, and the GPU's memory is the recorded total.
#[test]
fn the_benchmark_figures_are_the_recorded_runs() {
    let proof = read("docs/gpu-runs/2026-11-30-h200-measure-proof.md");
    let rows = table_after(&proof, "## Byte-for-byte comparison");
    let phase_rows: u64 = rows.iter().map(|r| r[2].parse::<u64>().unwrap()).sum();
    assert_eq!(phase_rows, 72);
    let benchmarks = read("docs/benchmarks.md");
    let claim = format!(
        "over the {} runs ({phase_rows} phase rows, {} figures)",
        rows.len(),
        phase_rows * 6
    );
    assert!(
        benchmarks.contains(&claim),
        "docs/benchmarks.md lacks `{claim}`"
    );

    let example: Value =
        serde_json::from_str(&read("data/exemple-mesure-h200-petit-essai.json")).unwrap();
    let total = example["environment"]["device"]["total_memory"]["bytes"]
        .as_u64()
        .unwrap();
    assert!(proof.contains(&format!("\"bytes\": {total}")));
    let mib = (total + (1 << 19)) >> 20;
    let claim = format!(
        "{} bytes = {} MiB",
        iteragpu_lab::units::grouped(total),
        iteragpu_lab::units::grouped(mib)
    );
    assert_eq!(claim, "150 109 880 320 bytes = 143 156 MiB");
    assert!(
        benchmarks.contains(&claim),
        "docs/benchmarks.md lacks `{claim}`"
    );
}

/// "about N seconds afterwards" as each text says it.
fn warm_start(text: &str) -> Option<String> {
    let end = text.find(" seconds afterwards")?;
    let start = text[..end].rfind("about ")?;
    Some(text[start..end].to_string())
}

#[test]
fn notebooks_and_their_page_give_the_same_warm_start_time() {
    let readme = warm_start(&read(NOTEBOOKS)).expect("docs/notebooks.md's warm start time");
    assert_eq!(readme, "about fifteen");
    for nb in [
        "notebooks/mesure-memoire.ipynb",
        "notebooks/allocated-vs-reserved.ipynb",
    ] {
        let v: Value = serde_json::from_str(&read(nb)).unwrap();
        let text = serde_json::to_string(&v["cells"]).unwrap();
        assert_eq!(warm_start(&text).as_deref(), Some(readme.as_str()), "{nb}");
    }
}

/// ARCHITECTURE.md's module map names every source file of both crates (test modules aside).
#[test]
fn the_module_map_names_every_source_file() {
    let map = read(ARCHITECTURE);
    let mut absent = Vec::new();
    for dir in ["src", "torch/src"] {
        let mut stack = vec![Path::new(ROOT).join(dir)];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                let rel = path.strip_prefix(ROOT).unwrap().display().to_string();
                if path.is_dir() {
                    stack.push(path);
                } else if rel.ends_with(".rs")
                    && !rel.ends_with("/tests.rs")
                    && !rel.ends_with("_tests.rs")
                    && !map.contains(&format!("`{rel}`"))
                {
                    absent.push(rel);
                }
            }
        }
    }
    assert!(absent.is_empty(), "ARCHITECTURE.md lacks {absent:?}");
}
