//! Stripped notebooks, as the release ships them: nbformat 4 with outputs, execution counts and
//! widget state stripped. Outputs are looked for in every shape they can take, not only the usual
//! one: an `outputs` member that is not an empty list (an object, a string, a list with items), on
//! any cell; an execution count; the widget state Jupyter saves in the notebook's metadata; and
//! nbformat 3, whose cells (and outputs) live in worksheets.

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

    /// A code cell as Jupyter saves it after a run, with its count cleared: the outputs alone
    /// must keep the notebook from being shipped.
    fn cell_with_output(output: &str) -> String {
        format!(
            r#"{{"cell_type":"code","execution_count":null,"metadata":{{}},"outputs":[{output}],"source":["1 + 1"]}}"#
        )
    }

    #[test]
    fn real_outputs_are_refused_without_an_execution_count() {
        let outputs = [
            r#"{"output_type":"stream","name":"stdout","text":["2\n"]}"#,
            r#"{"output_type":"execute_result","execution_count":1,"data":{"text/plain":["2"]},"metadata":{}}"#,
            r#"{"output_type":"display_data","data":{"text/html":["<table></table>"],"text/plain":["table"]},"metadata":{}}"#,
            r#"{"output_type":"error","ename":"Error","evalue":"boom","traceback":["boom"]}"#,
        ];
        for output in outputs {
            let cells = [
                r#"{"cell_type":"markdown","metadata":{},"source":["Title"]}"#.to_string(),
                cell_with_output(output),
            ];
            let nb = format!(
                r#"{{"cells":[{}],"metadata":{{}},"nbformat":4,"nbformat_minor":5}}"#,
                cells.join(",")
            );
            assert_eq!(
                unstripped_cells(nb.as_bytes()).unwrap(),
                ["code cell 1 carries outputs or an execution count"],
                "{output}"
            );
        }
        // Every offending cell is named, each once.
        let two = format!(
            r#"{{"cells":[{},{}],"metadata":{{}},"nbformat":4,"nbformat_minor":5}}"#,
            cell_with_output(r#"{"output_type":"stream","name":"stderr","text":["w"]}"#),
            cell_with_output(r#"{"output_type":"stream","name":"stdout","text":["x"]}"#)
        );
        assert_eq!(
            unstripped_cells(two.as_bytes()).unwrap(),
            [
                "code cell 0 carries outputs or an execution count",
                "code cell 1 carries outputs or an execution count"
            ]
        );
        // A notebook that is not JSON is an error, not a clean notebook.
        assert!(unstripped_cells(b"{\"cells\": [").is_err());
    }
}
