//! Notebook hygiene: notebooks are shipped in nbformat 4 with outputs, execution counts and
//! widget state stripped. Outputs are looked for in every shape they can take, not only the usual
//! one: an `outputs` member that is not an empty list (an object, a string, a list with items),
//! on any cell; an execution count; the widget state Jupyter saves in the notebook's metadata;
//! and nbformat 3, whose cells (and outputs) live in worksheets.

use serde_json::Value;

/// The key under which Jupyter saves widget state in a notebook's metadata.
const WIDGET_STATE: &str = "widgets";

/// Problems that keep a notebook from being shipped, one message per offending cell or field;
/// empty when it can be shipped. An error when the bytes are not JSON.
pub fn unstripped_cells(bytes: &[u8]) -> Result<Vec<String>, serde_json::Error> {
    let nb: Value = serde_json::from_slice(bytes)?;
    let mut problems = Vec::new();
    match nb.get("nbformat").and_then(Value::as_u64) {
        Some(4) => {}
        Some(n) => problems.push(format!(
            "nbformat {n}: only nbformat 4 is shipped (nbformat 3 keeps cells and outputs in \
             worksheets); convert it"
        )),
        None => problems.push("no nbformat: not a Jupyter notebook".into()),
    }
    if nb.get("worksheets").is_some() {
        problems.push("worksheets (nbformat 3) may hold outputs".into());
    }
    if nb
        .pointer(&format!("/metadata/{WIDGET_STATE}"))
        .is_some_and(|w| !w.is_null())
    {
        problems.push("the notebook's metadata carries widget state".into());
    }
    let Some(cells) = nb.get("cells").and_then(Value::as_array) else {
        problems.push("no list of cells".into());
        return Ok(problems);
    };
    for (i, cell) in cells.iter().enumerate() {
        let kind = cell.get("cell_type").and_then(Value::as_str).unwrap_or("?");
        let outputs = cell
            .get("outputs")
            .is_some_and(|o| o.as_array().is_none_or(|list| !list.is_empty()));
        let count = cell.get("execution_count").is_some_and(|c| !c.is_null());
        if outputs || count {
            problems.push(format!(
                "{kind} cell {i} carries outputs or an execution count"
            ));
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(json: &str) -> Vec<String> {
        unstripped_cells(json.as_bytes()).unwrap()
    }

    #[test]
    fn outputs_and_counts_are_found() {
        let clean = r#"{"nbformat":4,"cells":[{"cell_type":"code","execution_count":null,"outputs":[],"source":[]}]}"#;
        assert!(problems(clean).is_empty());
        let run = r#"{"nbformat":4,"cells":[{"cell_type":"markdown","source":[]},{"cell_type":"code","execution_count":3,"outputs":[],"source":[]}]}"#;
        assert_eq!(
            problems(run),
            ["code cell 1 carries outputs or an execution count"]
        );
    }

    #[test]
    fn outputs_in_other_shapes_are_found() {
        let object = r#"{"nbformat":4,"cells":[{"cell_type":"code","execution_count":null,"outputs":{"data":{"text/plain":"42"}},"source":[]}]}"#;
        assert_eq!(problems(object).len(), 1);
        let on_markdown =
            r#"{"nbformat":4,"cells":[{"cell_type":"markdown","outputs":["x"],"source":[]}]}"#;
        assert_eq!(
            problems(on_markdown),
            ["markdown cell 0 carries outputs or an execution count"]
        );
        let v3 = r#"{"nbformat":3,"worksheets":[{"cells":[{"cell_type":"code","outputs":[{"text":"42"}]}]}]}"#;
        let found = problems(v3);
        assert!(
            found.iter().any(|p| p.starts_with("nbformat 3")),
            "{found:?}"
        );
        assert!(found.iter().any(|p| p.contains("worksheets")), "{found:?}");
        let widgets = r#"{"nbformat":4,"metadata":{"widgets":{"application/vnd.jupyter.widget-state+json":{"state":{}}}},"cells":[]}"#;
        assert_eq!(
            problems(widgets),
            ["the notebook's metadata carries widget state"]
        );
    }
}
