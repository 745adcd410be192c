//! What this build is: the version, git commit and tree state, build date,
//! compiler and platform (from `build.rs`), for `--version`, the start-up
//! log and `kubernetes_build_info`.

/// The build facts.
#[derive(Clone, Copy, Debug)]
pub struct Build {
    /// `v0.1.0`.
    pub git_version: &'static str,
    /// The full commit hash, or `unknown`.
    pub git_commit: &'static str,
    /// `clean`, `dirty` or `unknown`.
    pub git_tree_state: &'static str,
    /// The commit's date, RFC 3339.
    pub build_date: &'static str,
    /// `rustc 1.95.0 (…)`.
    pub compiler: &'static str,
    /// `linux/amd64`.
    pub platform: &'static str,
    /// The major version.
    pub major: &'static str,
    /// The minor version.
    pub minor: &'static str,
}

/// This build.
pub const BUILD: Build = Build {
    git_version: concat!("v", env!("CARGO_PKG_VERSION")),
    git_commit: env!("VERDICT_GIT_COMMIT"),
    git_tree_state: env!("VERDICT_GIT_TREE_STATE"),
    build_date: env!("VERDICT_BUILD_DATE"),
    compiler: env!("VERDICT_COMPILER"),
    platform: env!("VERDICT_PLATFORM"),
    major: env!("CARGO_PKG_VERSION_MAJOR"),
    minor: env!("CARGO_PKG_VERSION_MINOR"),
};

impl Build {
    /// `verdict v0.1.0` (`--version`).
    pub fn line(&self) -> String {
        format!("verdict {}", self.git_version)
    }

    /// Every fact, one per line (`--version=raw`).
    pub fn raw(&self) -> String {
        format!(
            "gitVersion: {}\ngitCommit: {}\ngitTreeState: {}\nbuildDate: {}\ncompiler: {}\nplatform: {}\n",
            self.git_version,
            self.git_commit,
            self.git_tree_state,
            self.build_date,
            self.compiler,
            self.platform
        )
    }

    /// The labels of `kubernetes_build_info`, in its order.
    pub fn labels(&self) -> [(&'static str, &'static str); 9] {
        [
            ("major", self.major),
            ("minor", self.minor),
            ("git_version", self.git_version),
            ("git_commit", self.git_commit),
            ("git_tree_state", self.git_tree_state),
            ("build_date", self.build_date),
            ("go_version", self.compiler),
            ("compiler", "rustc"),
            ("platform", self.platform),
        ]
    }
}
