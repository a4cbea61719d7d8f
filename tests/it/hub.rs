//! Models named by their Hub id: from a local cache laid out as `huggingface_hub` lays it out,
//! and from a Hub-shaped HTTP server run by the test (no test reaches the network): the config,
//! the index and each shard's header by range requests, never the weights; the token sent only
//! where asked; a missing repository, a gated one, a header that lies, a server that ignores the
//! range or stalls, each refused with what it is.

use crate::common::{mesure_memoire as mm, model_folder, DATA_ERROR, FAILURE};
use iteragpu_lab::model::hub::{read, HubError, HubId, HubSettings};
use predicates::str::contains;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A repository's files (name → bytes), as the server serves them.
fn repo_files(sharded: bool) -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    model_folder(dir.path(), false);
    let mut files = BTreeMap::new();
    files.insert(
        "config.json".to_string(),
        std::fs::read(dir.path().join("config.json")).unwrap(),
    );
    let whole = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    if sharded {
        // The same header in two files, the index naming both.
        files.insert("model-00001-of-00002.safetensors".into(), whole.clone());
        files.insert("model-00002-of-00002.safetensors".into(), whole);
        let index = serde_json::json!({"weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}});
        files.insert(
            "model.safetensors.index.json".into(),
            index.to_string().into_bytes(),
        );
    } else {
        files.insert("model.safetensors".into(), whole);
    }
    files
}

/// How the test's Hub behaves.
#[derive(Clone, Default)]
struct Behaviour {
    /// Answers 401 without this bearer token.
    token: Option<String>,
    /// Answers the whole file to a range request.
    ignores_ranges: bool,
    /// Never answers.
    stalls: bool,
}

/// What the server was asked: each request's path and its Range header.
type Log = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// Serves `files` under `/org/name/resolve/{main|COMMIT}/` on a local port; its address and log.
fn hub(files: BTreeMap<String, Vec<u8>>, behaviour: Behaviour) -> (String, Log) {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let address = format!("http://{}", server.server_addr().to_ip().unwrap());
    let log: Log = Arc::default();
    let seen = log.clone();
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            let header = |name: &'static str| {
                (request.headers().iter())
                    .find(|h| h.field.equiv(name))
                    .map(|h| h.value.as_str().to_string())
            };
            let range = header("Range");
            seen.lock()
                .unwrap()
                .push((request.url().to_string(), range.clone()));
            if behaviour.stalls {
                std::thread::sleep(Duration::from_secs(30));
                continue;
            }
            let text = |code: u32, error: Option<&str>| {
                let r = tiny_http::Response::from_string("").with_status_code(code);
                match error {
                    Some(e) => r.with_header(
                        format!("X-Error-Code: {e}")
                            .parse::<tiny_http::Header>()
                            .unwrap(),
                    ),
                    None => r,
                }
            };
            if let Some(token) = &behaviour.token {
                if header("Authorization") != Some(format!("Bearer {token}")) {
                    let _ = request.respond(text(401, None));
                    continue;
                }
            }
            let url = request.url().to_string();
            let file = ["main", COMMIT]
                .iter()
                .find_map(|rev| url.strip_prefix(&format!("/org/name/resolve/{rev}/")));
            let Some(file) = file else {
                let _ = request.respond(text(404, Some("RepoNotFound")));
                continue;
            };
            let Some(bytes) = files.get(file) else {
                let _ = request.respond(text(404, Some("EntryNotFound")));
                continue;
            };
            let commit: tiny_http::Header = format!("X-Repo-Commit: {COMMIT}").parse().unwrap();
            let response = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
                Some(r) if !behaviour.ignores_ranges => {
                    let (a, b) = r.split_once('-').unwrap();
                    let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                    let b = b.min(bytes.len() - 1);
                    let content_range: tiny_http::Header =
                        format!("Content-Range: bytes {a}-{b}/{}", bytes.len())
                            .parse()
                            .unwrap();
                    tiny_http::Response::from_data(bytes[a..=b].to_vec())
                        .with_status_code(206)
                        .with_header(content_range)
                }
                _ => tiny_http::Response::from_data(bytes.clone()),
            };
            let _ = request.respond(response.with_header(commit));
        }
    });
    (address, log)
}

fn settings(endpoint: &str, token: Option<&str>) -> HubSettings {
    HubSettings {
        cache: None,
        offline: false,
        endpoint: endpoint.to_string(),
        token: token.map(str::to_string),
        timeout: Duration::from_secs(2),
    }
}

fn id() -> HubId {
    HubId::parse("org/name").unwrap()
}

#[test]
fn a_model_is_read_from_the_hub_by_its_headers_alone() {
    for sharded in [false, true] {
        let files = repo_files(sharded);
        let (endpoint, log) = hub(files.clone(), Behaviour::default());
        let m = read(&id(), &settings(&endpoint, None)).unwrap();
        assert_eq!(m.name, format!("org/name@{COMMIT}"));
        let c = m.checkpoint.expect("the headers read");
        let copies = if sharded { 2 } else { 1 };
        assert_eq!(c.tensors, 21 * copies);
        assert_eq!(c.elements, 106_816 * copies);
        assert_eq!(c.files.len() as u64, copies);
        // Every safetensors request was a range within the header: no weight was downloaded.
        let log = log.lock().unwrap();
        for (path, range) in log.iter().filter(|(p, _)| p.ends_with(".safetensors")) {
            let file = &files[path.rsplit('/').next().unwrap()];
            let header_end = 8 + u64::from_le_bytes(file[..8].try_into().unwrap());
            let last: u64 = range
                .as_ref()
                .expect("a range")
                .rsplit('-')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(last < header_end, "{path}: {range:?}");
        }
        // After the config, every request named the commit the Hub gave.
        assert!(
            log.iter().skip(1).all(|(p, _)| p.contains(COMMIT)),
            "{log:?}"
        );
    }
}

#[test]
fn the_token_is_sent_where_the_hub_asks_for_it() {
    let gated = Behaviour {
        token: Some("hf_test".into()),
        ..Behaviour::default()
    };
    let (endpoint, _) = hub(repo_files(false), gated);
    let refused = read(&id(), &settings(&endpoint, None)).unwrap_err();
    assert!(matches!(refused, HubError::Data(_)));
    assert!(refused.to_string().contains("set HF_TOKEN"), "{refused}");
    let wrong = read(&id(), &settings(&endpoint, Some("hf_other"))).unwrap_err();
    assert!(wrong.to_string().contains("refused the token"), "{wrong}");
    assert!(
        !wrong.to_string().contains("hf_other"),
        "the token is never printed: {wrong}"
    );
    assert!(read(&id(), &settings(&endpoint, Some("hf_test"))).is_ok());
}

#[test]
fn what_the_hub_cannot_give_is_refused_with_what_it_is() {
    let (endpoint, _) = hub(repo_files(false), Behaviour::default());
    let missing = read(
        &HubId::parse("org/other").unwrap(),
        &settings(&endpoint, None),
    )
    .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("no such repository or revision"),
        "{missing}"
    );
    // A header whose length runs past the file.
    let mut files = repo_files(false);
    let st = files.get_mut("model.safetensors").unwrap();
    st[..8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let (endpoint, _) = hub(files, Behaviour::default());
    let lies = read(&id(), &settings(&endpoint, None)).unwrap_err();
    assert!(matches!(lies, HubError::Data(_)));
    assert!(
        lies.to_string()
            .contains("header length 1048576 is larger than the file"),
        "{lies}"
    );
    // A server that answers a range request with the whole file.
    let whole = Behaviour {
        ignores_ranges: true,
        ..Behaviour::default()
    };
    let (endpoint, _) = hub(repo_files(false), whole);
    let e = read(&id(), &settings(&endpoint, None)).unwrap_err();
    assert!(
        e.to_string().contains("the weights are never downloaded"),
        "{e}"
    );
    // A server that never answers: given up at the timeout, an I/O failure.
    let stalls = Behaviour {
        stalls: true,
        ..Behaviour::default()
    };
    let (endpoint, _) = hub(repo_files(false), stalls);
    let mut s = settings(&endpoint, None);
    s.timeout = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let e = read(&id(), &s).unwrap_err();
    assert!(matches!(e, HubError::Network(_)), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A cache as `huggingface_hub` lays it out: the snapshot's files are links to blobs.
fn cache_with_model(cache: &Path) {
    let repo = cache.join("models--org--name");
    let snapshot = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), COMMIT).unwrap();
    let blobs = repo.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let folder = tempfile::tempdir().unwrap();
    model_folder(folder.path(), false);
    for (i, name) in ["config.json", "model.safetensors"].iter().enumerate() {
        let blob = blobs.join(format!("blob{i}"));
        std::fs::copy(folder.path().join(name), &blob).unwrap();
        std::os::unix::fs::symlink(&blob, snapshot.join(name)).unwrap();
    }
}

/// `mesure_memoire budget --model MODEL` of a small inference, with the Hugging Face variables
/// `env` sets (and no token, nor offline mode, from the caller's environment).
/// The environment of a budget that reads the Hub at `endpoint`, its cache (`empty`) holding
/// nothing.
fn from_the_hub<'a>(
    empty: &'a Path,
    endpoint: &'a str,
) -> [(&'static str, &'a std::ffi::OsStr); 3] {
    [
        ("HF_HUB_CACHE", empty.as_os_str()),
        ("HF_HOME", empty.as_os_str()),
        ("HF_ENDPOINT", endpoint.as_ref()),
    ]
}

fn budget_of(model: &str, env: &[(&str, &std::ffi::OsStr)]) -> assert_cmd::Command {
    let mut c = mm();
    c.env_remove("HF_HUB_OFFLINE").env_remove("HF_TOKEN");
    for (name, value) in env {
        c.env(name, value);
    }
    c.args([
        "budget",
        "--model",
        model,
        "--mode",
        "inference",
        "--context",
        "64",
    ]);
    c
}

#[test]
fn budget_reads_a_hub_id_from_the_local_cache_and_names_the_commit() {
    let cache = tempfile::tempdir().unwrap();
    cache_with_model(cache.path());
    let env = [
        ("HF_HUB_CACHE", cache.path().as_os_str()),
        ("HF_HUB_OFFLINE", "1".as_ref()),
    ];
    let out = budget_of("org/name", &env).assert().success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        text.starts_with(&format!(
            "Budget — org/name@{COMMIT}, read from the local cache (llama)"
        )),
        "{text}"
    );
    assert!(text.contains("holds 21 tensors"), "{text}");
    // Offline, a repository the cache lacks is refused, naming it and the cache.
    budget_of("org/other", &env)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("org/other@main: not in the local cache"));
}

#[test]
fn budget_reads_a_hub_id_from_the_hub_and_refuses_a_missing_repository() {
    let (endpoint, _) = hub(repo_files(true), Behaviour::default());
    let empty = tempfile::tempdir().unwrap();
    let env = from_the_hub(empty.path(), &endpoint);
    budget_of("org/name", &env)
        .assert()
        .success()
        .stdout(contains(format!(
            "Budget — org/name@{COMMIT}, read from {endpoint} (llama)"
        )));
    budget_of("org/missing", &env)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("--model org/missing"))
        .stderr(contains("no such repository or revision"));
    // A server that cannot be reached: an I/O failure naming the address.
    let unreachable = from_the_hub(empty.path(), "http://127.0.0.1:9");
    budget_of("org/name", &unreachable)
        .assert()
        .code(FAILURE)
        .stderr(contains(
            "http://127.0.0.1:9/org/name/resolve/main/config.json",
        ));
}

/// Llama 3.1 8B Instruct's `generation_config.json`, as shipped: generate samples by default.
const SAMPLING_DEFAULTS: &str = r#"{"bos_token_id": 128000, "do_sample": true,
    "eos_token_id": [128001, 128008, 128009], "temperature": 0.6, "top_p": 0.9}"#;

#[test]
fn the_models_generation_config_is_read_from_the_hub_and_the_cache() {
    let mut files = repo_files(false);
    let (endpoint, _) = hub(files.clone(), Behaviour::default());
    assert_eq!(
        read(&id(), &settings(&endpoint, None)).unwrap().generation,
        None
    );
    files.insert("generation_config.json".into(), SAMPLING_DEFAULTS.into());
    let (endpoint, _) = hub(files, Behaviour::default());
    let g = read(&id(), &settings(&endpoint, None))
        .unwrap()
        .generation
        .unwrap();
    assert_eq!((g.do_sample, g.top_k), (Some(true), None));
    let empty = tempfile::tempdir().unwrap();
    let env = from_the_hub(empty.path(), &endpoint);
    budget_of("org/name", &env)
        .assert()
        .success()
        .stdout(contains("sampling (temperature 0.6, top_k 50, top_p 0.9)"))
        .stdout(contains(
            "read from the model's generation_config.json (do_sample true",
        ));
    // From the cache: the snapshot's file, which --greedy overrides.
    let cache = tempfile::tempdir().unwrap();
    cache_with_model(cache.path());
    let snapshot = cache
        .path()
        .join(format!("models--org--name/snapshots/{COMMIT}"));
    std::fs::write(snapshot.join("generation_config.json"), SAMPLING_DEFAULTS).unwrap();
    let env = [
        ("HF_HUB_CACHE", cache.path().as_os_str()),
        ("HF_HUB_OFFLINE", "1".as_ref()),
    ];
    budget_of("org/name", &env)
        .assert()
        .success()
        .stdout(contains("sampling (temperature 0.6, top_k 50, top_p 0.9)"));
    let out = budget_of("org/name", &env)
        .arg("--greedy")
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(!text.contains("sampling ("), "{text}");
}

/// A checkpoint saved by GPTQ named by its Hub id: its config and its header read from the Hub
/// (the weights never), budgeted as stored and said not to be a replayed verdict.
#[test]
fn a_checkpoint_saved_by_gptq_is_budgeted_from_the_hub_by_its_headers() {
    let dir = tempfile::tempdir().unwrap();
    let (stored, elements) = crate::common::gptq_folder(dir.path());
    let files: BTreeMap<String, Vec<u8>> = ["config.json", "model.safetensors"]
        .into_iter()
        .map(|f| (f.to_string(), std::fs::read(dir.path().join(f)).unwrap()))
        .collect();
    let (endpoint, log) = hub(files, Behaviour::default());
    let empty = tempfile::tempdir().unwrap();
    let env = from_the_hub(empty.path(), &endpoint);
    let run = |more: &[&str]| {
        let out = budget_of("org/name", &env)
            .args(["--dtype", "float16"])
            .args(more)
            .assert()
            .success();
        String::from_utf8(out.get_output().stdout.clone()).unwrap()
    };
    let text = run(&[]);
    assert!(
        text.contains("4-bit GPTQ in groups of 128 weights as the checkpoint saved them"),
        "{text}"
    );
    assert!(text.contains("NOT A REPLAYED VERDICT"), "{text}");
    let elements = iteragpu_lab::units::grouped(elements);
    assert!(
        text.contains(&format!(": the {elements} elements the config's")),
        "{text}"
    );
    // What the checkpoint holds, and the rotary frequencies' two buffers beside it.
    let json: serde_json::Value = serde_json::from_str(&run(&["--json"])).unwrap();
    let weights = &json["budget"]["terms"][0];
    assert_eq!(weights["key"], "weights");
    assert_eq!(weights["bytes"]["bytes"], stored + 64);
    // Only the header was asked of the weights' file.
    let asked = log.lock().unwrap();
    assert!(asked
        .iter()
        .filter(|(path, _)| path.ends_with("model.safetensors"))
        .all(|(_, range)| range.is_some()));
}
