//! Every integration test of the library and its programs, in one binary (one link): the
//! command lines, the files they read and write, the recorded GPU proofs replayed, the documents
//! and the module map kept true. `common` is what they share.

mod budget;
mod bundle;
mod bundle_form;
mod bundle_release;
mod catalog;
mod cli;
mod common;
mod docs;
mod fuzz;
mod grid;
mod hf_proof;
mod hf_traces;
mod hub;
mod inputs;
mod lesson;
mod model_counts;
mod modules;
mod notebooks;
mod pipes;
mod sweep;
