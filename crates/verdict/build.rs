//! Build facts for `--version`, the start-up log and `kubernetes_build_info`:
//! the git commit and tree state, the build date (the commit's, so that a
//! rebuild of one commit is identical) and the compiler. Each can be given
//! instead through the environment (`VERDICT_GIT_COMMIT`,
//! `VERDICT_GIT_TREE_STATE`, `VERDICT_BUILD_DATE`), as an image build
//! without `.git` does.

use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd)
        .args(args)
        .env("TZ", "UTC")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// An environment variable, if set and not empty.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() {
    for var in [
        "VERDICT_GIT_COMMIT",
        "VERDICT_GIT_TREE_STATE",
        "VERDICT_BUILD_DATE",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if let Some(git_dir) = output("git", &["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
        println!("cargo:rerun-if-changed={git_dir}/index");
        if let Some(head) = output("git", &["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={git_dir}/{head}");
        }
    }
    let commit = var("VERDICT_GIT_COMMIT")
        .or_else(|| output("git", &["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let tree = var("VERDICT_GIT_TREE_STATE")
        .or_else(|| {
            output("git", &["rev-parse", "HEAD"])?;
            let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"]);
            Some(if dirty.is_some() { "dirty" } else { "clean" }.into())
        })
        .unwrap_or_else(|| "unknown".into());
    let date = var("VERDICT_BUILD_DATE")
        .or_else(|| {
            output(
                "git",
                &[
                    "log",
                    "-1",
                    "--format=%cd",
                    "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
                ],
            )
        })
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let compiler = output(&rustc, &["--version"]).unwrap_or_else(|| "rustc".into());
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH")
        .unwrap_or_default()
        .as_str()
    {
        "x86_64" => "amd64".to_owned(),
        "aarch64" => "arm64".to_owned(),
        "x86" => "386".to_owned(),
        other => other.to_owned(),
    };
    println!("cargo:rustc-env=VERDICT_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=VERDICT_GIT_TREE_STATE={tree}");
    println!("cargo:rustc-env=VERDICT_BUILD_DATE={date}");
    println!("cargo:rustc-env=VERDICT_COMPILER={compiler}");
    println!("cargo:rustc-env=VERDICT_PLATFORM={os}/{arch}");
}
