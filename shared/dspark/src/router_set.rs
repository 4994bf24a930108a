//! A routed drafter set: a folder whose `router.json` names DSpark drafter folders (paths
//! relative to it), the route a generation without prompt tokens takes, and the
//! [`TokenRouter`] that picks a drafter from each generation's prompt
//! ([`tandem_core::Routed`]). `tandem train-router` writes it; `--drafter` accepts its folder
//! wherever it accepts a drafter folder.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tandem_core::TokenRouter;

use crate::error::{DsparkError, Result};

/// The file that makes a folder a routed set.
pub const ROUTER_FILE: &str = "router.json";
/// `kind` of a router file.
const KIND: &str = "tandem-drafter-router";

/// One route: the router's class and the drafter it sends generations to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteSpec {
    /// The class name (a metric label).
    pub name: String,
    /// The drafter folder, relative to the set's folder.
    pub drafter: PathBuf,
}

/// The contents of `router.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterManifest {
    /// Always `tandem-drafter-router`.
    pub kind: String,
    /// Format version (1).
    pub version: u32,
    /// The routes, in the router's class order.
    pub routes: Vec<RouteSpec>,
    /// The route of a generation whose rows come without tokens.
    pub default: String,
    /// What the router was fitted on and how well it routed held-out text (free-form).
    #[serde(default)]
    pub trained: serde_json::Value,
    /// The classifier.
    pub router: TokenRouter,
}

impl RouterManifest {
    /// A manifest of `routes` for `router` (its classes in the same order).
    pub fn new(routes: Vec<RouteSpec>, default: String, router: TokenRouter) -> Self {
        Self {
            kind: KIND.into(),
            version: 1,
            routes,
            default,
            trained: serde_json::Value::Null,
            router,
        }
    }

    /// Reads and checks the manifest of the set in `dir`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(ROUTER_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| DsparkError::Io {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| DsparkError::checkpoint(&path, reason))
    }

    /// Parses and checks a manifest's text.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let m: Self = serde_json::from_str(text).map_err(|e| e.to_string())?;
        m.check()?;
        Ok(m)
    }

    /// Writes the manifest to `dir/router.json`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(ROUTER_FILE);
        self.check()
            .map_err(|reason| DsparkError::checkpoint(&path, reason))?;
        let io = |source| DsparkError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let text = serde_json::to_string(self).map_err(|e| DsparkError::Invalid(e.to_string()))?;
        std::fs::write(&path, text + "\n").map_err(io)
    }

    /// What is wrong with the manifest, if anything.
    fn check(&self) -> std::result::Result<(), String> {
        if self.kind != KIND || self.version != 1 {
            return Err(format!(
                "kind {:?} version {}, expected {KIND:?} version 1",
                self.kind, self.version
            ));
        }
        let names: Vec<&str> = self.routes.iter().map(|r| r.name.as_str()).collect();
        (self
            .router
            .check()
            .and_then(|()| self.router.check_classes(&names)))
        .map_err(|e| e.to_string())?;
        match self.default_index() {
            Some(_) => Ok(()),
            None => Err(format!(
                "the default route {:?} is not a route",
                self.default
            )),
        }
    }

    /// The index of the default route.
    pub fn default_index(&self) -> Option<usize> {
        self.routes.iter().position(|r| r.name == self.default)
    }

    /// Each route's drafter folder, resolved against the set's folder `dir`.
    pub fn drafter_dirs(&self, dir: &Path) -> Vec<PathBuf> {
        self.routes.iter().map(|r| dir.join(&r.drafter)).collect()
    }
}

/// Whether `dir` is a routed set.
pub fn is_set(dir: &Path) -> bool {
    dir.join(ROUTER_FILE).is_file()
}

#[cfg(test)]
mod tests {
    use tandem_core::TokenRouter;

    use super::*;

    fn manifest() -> RouterManifest {
        let router = TokenRouter {
            classes: vec!["docs".into(), "general".into()],
            ids: vec![3, 7],
            log_probs: vec![vec![-1.0, -2.0], vec![-2.0, -1.0]],
            unseen: vec![-9.0, -9.0],
            bias: vec![0.5, 0.0],
            min_tokens: 1,
            max_tokens: None,
        };
        let route = |name: &str, dir: &str| RouteSpec {
            name: name.into(),
            drafter: dir.into(),
        };
        let routes = vec![route("docs", "../a"), route("general", "../b")];
        RouterManifest::new(routes, "general".into(), router)
    }

    #[test]
    fn a_written_manifest_reads_back_and_resolves_its_drafters() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("set");
        assert!(!is_set(&dir));
        manifest().write(&dir).expect("write");
        assert!(is_set(&dir));
        let m = RouterManifest::read(&dir).expect("read");
        assert_eq!(m, manifest());
        assert_eq!(m.default_index(), Some(1));
        assert_eq!(
            m.drafter_dirs(&dir),
            vec![dir.join("../a"), dir.join("../b")]
        );
    }

    #[test]
    fn broken_manifests_are_refused_naming_the_file() {
        let tmp = tempfile::tempdir().expect("tmp");
        let refused = |case: &str, change: &dyn Fn(&mut RouterManifest)| {
            let mut m = manifest();
            change(&mut m);
            let dir = tmp.path().join(case);
            std::fs::create_dir_all(&dir).expect("dir");
            assert!(m.write(&dir).is_err(), "{case} was written");
            let text = serde_json::to_string(&m).expect("json");
            std::fs::write(dir.join(ROUTER_FILE), text).expect("write");
            let e = RouterManifest::read(&dir).expect_err("refused").to_string();
            assert!(e.contains(ROUTER_FILE), "{case}: {e}");
        };
        refused("kind", &|m| m.kind = "other".into());
        refused("version", &|m| m.version = 2);
        refused("default", &|m| m.default = "poetry".into());
        refused("order", &|m| m.routes.swap(0, 1));
        refused("router", &|m| m.router.unseen.push(0.0));
        std::fs::write(tmp.path().join(ROUTER_FILE), "{").expect("write");
        assert!(RouterManifest::read(tmp.path()).is_err());
    }
}
