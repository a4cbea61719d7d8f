//! A model named by its Hugging Face Hub id, `ORG/NAME[@REVISION]`: read from the local cache as
//! `huggingface_hub` lays it out (`models--ORG--NAME/refs/REVISION` → `snapshots/COMMIT/`), else,
//! unless `HF_HUB_OFFLINE` is set, from the Hub's HTTP API: `config.json`, the safetensors index
//! and each shard's header by range requests, never the weights, and `generation_config.json`. A token (`HF_TOKEN`, else the
//! token file) is sent to the Hub for gated and private repositories, never printed or written.

use super::folder::{self, Checkpoint, FolderError};
use super::Model;
use crate::files::Input;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A Hub id as typed: the repository and the revision asked for (a branch, a tag or a commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    pub repo: String,
    pub revision: String,
}

impl HubId {
    /// Reads `ORG/NAME[@REVISION]` (the revision `main` when not given). The names are those the
    /// Hub allows (letters, digits, `-`, `_`, `.`), so that they never leave the cache's folder.
    pub fn parse(text: &str) -> Result<HubId, String> {
        let (repo, revision) = text.split_once('@').unwrap_or((text, "main"));
        let name_ok = |s: &str| {
            !s.is_empty()
                && !s.starts_with('.')
                && !s.contains("..")
                && s.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 || !parts.iter().all(|p| name_ok(p)) {
            return Err(format!(
                "`{}` is not a Hub id ORG/NAME[@REVISION]",
                crate::text::printable(text)
            ));
        }
        // A revision may hold slashes (`refs/pr/1`), each part a name.
        if !revision.split('/').all(name_ok) {
            return Err(format!(
                "`{}` is not a revision (a branch, a tag or a commit)",
                crate::text::printable(revision)
            ));
        }
        Ok(HubId {
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }
}

/// Where and how models are looked up.
#[derive(Debug, Clone)]
pub struct HubSettings {
    /// The cache folder (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    pub cache: Option<PathBuf>,
    /// `HF_HUB_OFFLINE`: the cache only.
    pub offline: bool,
    /// The Hub's address (`HF_ENDPOINT`, else the public Hub).
    pub endpoint: String,
    /// The token sent to the Hub (`HF_TOKEN`, else the token file).
    pub token: Option<String>,
    /// How long a connection or a read may wait.
    pub timeout: Duration,
}

impl HubSettings {
    /// The settings `huggingface_hub` reads from the environment.
    pub fn from_env() -> HubSettings {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let home = var("HF_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache").join("huggingface")));
        let token_file = var("HF_TOKEN_PATH")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join("token")));
        let token = var("HF_TOKEN").or_else(|| {
            let text = std::fs::read_to_string(token_file?).ok()?;
            Some(text.trim().to_string()).filter(|t| !t.is_empty())
        });
        HubSettings {
            cache: var("HF_HUB_CACHE")
                .map(PathBuf::from)
                .or_else(|| home.map(|h| h.join("hub"))),
            offline: var("HF_HUB_OFFLINE")
                .is_some_and(|v| ["1", "true", "yes", "on"].contains(&v.to_lowercase().as_str())),
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()),
            token,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A model read by its Hub id: where from, and the commit read.
#[derive(Debug, Clone)]
pub struct HubModel {
    pub model: Model,
    pub checkpoint: Option<Checkpoint>,
    /// Its `generation_config.json`, where it has one.
    pub generation: Option<super::generation::GenerationDefaults>,
    /// `ORG/NAME@COMMIT`.
    pub name: String,
    /// `the local cache` or the Hub's address.
    pub read_from: String,
}

/// Why a model could not be read by its Hub id.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(transparent)]
    Folder(#[from] FolderError),
    #[error("{0}")]
    Data(String),
    #[error("{0}")]
    Network(String),
}

impl crate::status::Classify for HubError {
    fn status(&self) -> crate::status::Status {
        match self {
            HubError::Folder(e) => e.status(),
            HubError::Data(_) => crate::status::Status::DataError,
            HubError::Network(_) => crate::status::Status::Failure,
        }
    }
}

/// Reads the model `id` names: from the local cache when it holds the revision's `config.json`,
/// else from the Hub.
pub fn read(id: &HubId, settings: &HubSettings) -> Result<HubModel, HubError> {
    if let Some((snapshot, commit)) = settings
        .cache
        .as_deref()
        .and_then(|c| cached_snapshot(c, id))
    {
        let (model, checkpoint) = folder::read_with_checkpoint(&snapshot)?;
        return Ok(HubModel {
            model,
            checkpoint,
            generation: super::generation::read(&snapshot)?,
            name: format!("{}@{commit}", id.repo),
            read_from: "the local cache".into(),
        });
    }
    if settings.offline {
        return Err(HubError::Data(format!(
            "{}@{}: not in the local cache ({}) and HF_HUB_OFFLINE is set",
            id.repo,
            id.revision,
            settings
                .cache
                .as_deref()
                .map_or("none".into(), |c| c.display().to_string())
        )));
    }
    Remote::new(id, settings).read()
}

fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// The snapshot folder of `id`'s revision in the cache, and its commit, if it holds a
/// `config.json`.
fn cached_snapshot(cache: &Path, id: &HubId) -> Option<(PathBuf, String)> {
    let repo = cache.join(format!("models--{}", id.repo.replace('/', "--")));
    let commit = if is_commit(&id.revision) {
        id.revision.clone()
    } else {
        let text = std::fs::read_to_string(repo.join("refs").join(&id.revision)).ok()?;
        Some(text.trim().to_string()).filter(|c| is_commit(c))?
    };
    let snapshot = repo.join("snapshots").join(&commit);
    snapshot
        .join("config.json")
        .is_file()
        .then_some((snapshot, commit))
}

/// A small file read whole from the Hub.
struct SmallFile {
    bytes: Vec<u8>,
    /// `X-Repo-Commit`: the commit the file is of.
    commit: Option<String>,
}

/// One model read over HTTP.
struct Remote<'a> {
    agent: ureq::Agent,
    settings: &'a HubSettings,
    id: &'a HubId,
    /// The revision the requests name: the commit once the Hub gave it.
    revision: String,
}

impl<'a> Remote<'a> {
    fn new(id: &'a HubId, settings: &'a HubSettings) -> Remote<'a> {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(settings.timeout)
            .timeout_read(settings.timeout)
            .timeout_write(settings.timeout)
            .build();
        Remote {
            agent,
            settings,
            id,
            revision: id.revision.clone(),
        }
    }

    fn url(&self, file: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{file}",
            self.settings.endpoint.trim_end_matches('/'),
            self.id.repo,
            self.revision
        )
    }

    /// GET of `file`, the bytes `range` (first, last) only when given; `None` when the
    /// repository has no such file.
    fn get(
        &self,
        file: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Option<ureq::Response>, HubError> {
        let url = self.url(file);
        let mut request = self.agent.get(&url);
        if let Some(token) = &self.settings.token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        if let Some((first, last)) = range {
            request = request.set("Range", &format!("bytes={first}-{last}"));
        }
        let repo = format!("{}@{}", self.id.repo, self.id.revision);
        match request.call() {
            Ok(r) => Ok(Some(r)),
            Err(ureq::Error::Status(404, r)) => {
                // The Hub says which is missing: the repository or the file.
                match r.header("X-Error-Code") {
                    Some("RepoNotFound") | Some("RevisionNotFound") => Err(HubError::Data(format!(
                        "{repo}: no such repository or revision on {} (or it is private: set HF_TOKEN)",
                        self.settings.endpoint
                    ))),
                    _ => Ok(None),
                }
            }
            Err(ureq::Error::Status(401, _)) => Err(HubError::Data(match self.settings.token {
                None => format!(
                    "{repo}: {} asks for a token (a gated or private repository): set HF_TOKEN or log in with `hf auth login`",
                    self.settings.endpoint
                ),
                Some(_) => format!("{repo}: {} refused the token", self.settings.endpoint),
            })),
            Err(ureq::Error::Status(403, _)) => Err(HubError::Data(format!(
                "{repo}: access refused (a gated repository: accept its terms on the Hub with the token's account)"
            ))),
            Err(ureq::Error::Status(code, _)) => Err(HubError::Network(format!(
                "{url}: the server answered HTTP {code}"
            ))),
            Err(ureq::Error::Transport(t)) => Err(HubError::Network(format!("{url}: {t}"))),
        }
    }

    /// The whole of a small file (at most `kind`'s limit), and the commit the Hub says it is of.
    fn small_file(&self, file: &str, kind: Input) -> Result<Option<SmallFile>, HubError> {
        let Some(r) = self.get(file, None)? else {
            return Ok(None);
        };
        let commit = r.header("X-Repo-Commit").map(str::to_string);
        let bytes = crate::files::read_at_most(r.into_reader(), kind.limit())
            .map_err(|e| HubError::Network(format!("{}: {e}", self.url(file))))?
            .ok_or_else(|| {
                HubError::Data(format!(
                    "{}: larger than {} bytes",
                    self.url(file),
                    kind.limit()
                ))
            })?;
        Ok(Some(SmallFile { bytes, commit }))
    }

    /// Bytes `first..=last` of `file`, exactly, and the file's length (`None`: no such file):
    /// the server must answer the range (206 with its Content-Range), never the whole file.
    fn range(&self, file: &str, first: u64, last: u64) -> Result<Option<(Vec<u8>, u64)>, HubError> {
        let url = self.url(file);
        let bad = |m: String| HubError::Data(format!("{url}: {m}"));
        let Some(r) = self.get(file, Some((first, last)))? else {
            return Ok(None);
        };
        if r.status() != 206 {
            return Err(bad(format!(
                "the server answered HTTP {} to a range request (the weights are never downloaded)",
                r.status()
            )));
        }
        let total = r
            .header("Content-Range")
            .and_then(|c| c.strip_prefix(&format!("bytes {first}-{last}/")))
            .and_then(|t| t.parse::<u64>().ok())
            .ok_or_else(|| bad("no Content-Range of the bytes asked for".into()))?;
        let want = last - first + 1;
        let mut bytes = Vec::new();
        r.into_reader()
            .take(want + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| HubError::Network(format!("{url}: {e}")))?;
        if bytes.len() as u64 != want {
            return Err(bad(format!(
                "{} bytes answered where {want} were asked",
                bytes.len()
            )));
        }
        Ok(Some((bytes, total)))
    }

    /// One shard's header added to `c`; `false` when the repository has no such file.
    fn header(&self, file: &str, c: &mut Checkpoint) -> Result<bool, HubError> {
        let Some((n, total)) = self.range(file, 0, 7)? else {
            return Ok(false);
        };
        let n = u64::from_le_bytes(n.try_into().expect("8 bytes"));
        let limit = Input::SafetensorsHeader.limit();
        if n == 0 || n > limit || n.checked_add(8).is_none_or(|end| end > total) {
            return Err(HubError::Data(format!(
                "{}: header length {n} is larger than the file ({total} bytes) or than {limit}",
                self.url(file)
            )));
        }
        let bad = |m: String| HubError::Data(format!("{}: {m}", self.url(file)));
        let (text, _) = self
            .range(file, 8, 8 + n - 1)?
            .ok_or_else(|| bad("gone between two requests".into()))?;
        c.add_header(&text, total - 8 - n).map_err(bad)?;
        c.files.push(file.to_string());
        Ok(true)
    }

    fn read(mut self) -> Result<HubModel, HubError> {
        let SmallFile {
            bytes: config,
            commit,
        } = self
            .small_file("config.json", Input::ModelConfig)?
            .ok_or_else(|| {
                HubError::Data(format!(
                    "{}@{}: the repository holds no config.json",
                    self.id.repo, self.id.revision
                ))
            })?;
        // Every later request names the commit read, so that all come from one snapshot.
        let commit = commit.filter(|c| is_commit(c));
        if let Some(c) = &commit {
            self.revision = c.clone();
        }
        let model = folder::parse_config(&config, &self.url("config.json"))?;
        let index = self.small_file("model.safetensors.index.json", Input::ModelConfig)?;
        let mut checkpoint = Checkpoint::empty();
        match index {
            Some(index) => {
                let file = self.url("model.safetensors.index.json");
                let shards = folder::shard_names(&index.bytes)
                    .map_err(|m| HubError::Data(format!("{file}: {m}")))?;
                for shard in &shards {
                    if !self.header(shard, &mut checkpoint)? {
                        return Err(HubError::Data(format!(
                            "{file}: shard {} is missing",
                            crate::text::printable(shard)
                        )));
                    }
                }
            }
            // One file, or none: a repository without safetensors weights gives the config alone.
            None => {
                self.header("model.safetensors", &mut checkpoint)?;
            }
        }
        let checkpoint = (!checkpoint.files.is_empty()).then_some(checkpoint);
        let file = super::generation::FILE;
        let generation = match self.small_file(file, Input::ModelConfig)? {
            Some(g) => Some(super::generation::parse(&g.bytes, &self.url(file))?),
            None => None,
        };
        Ok(HubModel {
            model,
            checkpoint,
            generation,
            name: format!(
                "{}@{}",
                self.id.repo,
                commit.as_deref().unwrap_or(&self.id.revision)
            ),
            read_from: self.settings.endpoint.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_are_read_as_the_hub_names_them() {
        let id = HubId::parse("Qwen/Qwen3-8B").unwrap();
        assert_eq!(
            (id.repo.as_str(), id.revision.as_str()),
            ("Qwen/Qwen3-8B", "main")
        );
        let id = HubId::parse("meta-llama/Llama-3.1-8B@refs/pr/1").unwrap();
        assert_eq!(id.revision, "refs/pr/1");
        for bad in [
            "llama", "a/b/c", "../x/y", "a/..", "a/b@../c", "a/b@", "/b", "a/b c",
        ] {
            assert!(HubId::parse(bad).is_err(), "{bad}");
        }
    }
}
