//! `config.json` files read as transformers 5.17 reads them: for every configuration of
//! `tests/fixtures/model-counts.json` (written by `scripts/model-counts.py` from transformers
//! itself, `AutoModelForCausalLM.from_config` on the meta device), the parameter count, the
//! parameter tensors in `named_parameters()` order and the buffers are transformers' own; the
//! configurations transformers refuses are refused.

use iteragpu_lab::model::config;

fn fixture() -> Vec<serde_json::Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/model-counts.json"
    );
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn listed(entry: &serde_json::Value, key: &str) -> Vec<(String, Vec<u64>)> {
    entry[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let shape = t[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (t[0].as_str().unwrap().to_string(), shape)
        })
        .collect()
}

/// Whether a tensor's name is one the fixture lists (layers 0 to 2 and the others).
fn kept(name: &str) -> bool {
    match name.strip_prefix("model.layers.") {
        Some(rest) => rest
            .split('.')
            .next()
            .and_then(|i| i.parse::<u64>().ok())
            .is_some_and(|i| i < 3),
        None => true,
    }
}

#[test]
fn parameter_counts_and_tensors_are_transformers_own() {
    let entries = fixture();
    let mut checked = 0;
    for e in entries.iter().filter(|e| e.get("refused").is_none()) {
        let name = e["name"].as_str().unwrap();
        let model = config::from_value(&e["config"]).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(
            model.parameter_count(),
            e["parameters"].as_u64().unwrap(),
            "{name}"
        );
        let ours = model.parameters();
        assert_eq!(
            ours.len() as u64,
            e["layer_tensor_count"].as_u64().unwrap(),
            "{name}"
        );
        let theirs = listed(e, "tensors");
        let ours: Vec<(String, Vec<u64>)> = ours
            .into_iter()
            .filter(|p| !e["tensors_truncated"].as_bool().unwrap() || kept(&p.name))
            .map(|p| (p.name, p.shape))
            .collect();
        assert_eq!(ours, theirs, "{name}");
        let buffers: Vec<(String, Vec<u64>)> = model
            .buffers()
            .into_iter()
            .map(|b| (b.name, b.shape))
            .collect();
        assert_eq!(
            buffers.len() as u64,
            e["buffer_count"].as_u64().unwrap(),
            "{name} buffers"
        );
        let theirs = listed(e, "buffers");
        let ours: Vec<_> = buffers
            .into_iter()
            .filter(|(n, _)| theirs.iter().any(|(t, _)| t == n) || kept(n))
            .collect();
        assert_eq!(ours, theirs, "{name} buffers");
        checked += 1;
    }
    assert!(checked >= 60, "{checked} configurations");
}

#[test]
fn configurations_transformers_refuses_are_refused_naming_the_field() {
    for e in fixture().iter().filter(|e| e.get("refused").is_some()) {
        let name = e["name"].as_str().unwrap();
        // transformers' own quirk: Phi-3's default pad token 32000 outside a small vocabulary.
        if name.contains("pad-token") {
            continue;
        }
        let err = config::from_value(&e["config"]).expect_err(name);
        let text = err.to_string();
        assert!(text.contains('`'), "{name}: {text}");
    }
}
