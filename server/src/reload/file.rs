//! `--config file:PATH`: a YAML file, or a directory of YAML files such as a ConfigMap
//! mounted by the kubelet (whose `..data` symlink is swapped atomically on update).
//! Watched with inotify on the directory, so renames and symlink swaps are seen.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::reloader::Reloader;
use crate::net::events::{classify, settle};

/// Reads the config text at `path`: the file, or every non-hidden `*.yaml`/`*.yml` file of
/// the directory in name order.
///
/// # Errors
/// The path or one of its files cannot be read.
pub fn read_path(path: &Path) -> std::io::Result<Vec<(String, String)>> {
    if !path.is_dir() {
        return Ok(vec![(path.display().to_string(), std::fs::read_to_string(path)?)]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml")) && p.is_file()
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| Ok((p.display().to_string(), std::fs::read_to_string(&p)?)))
        .collect()
}

/// Watches `path` and reloads on every change, until the process ends.
///
/// # Errors
/// The inotify watch could not be set up.
pub async fn watch_path(path: PathBuf, reloader: Arc<Reloader>) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Some(signal) = ev.ok().and_then(|ev| classify(&ev.kind)) {
            let _ = tx.send(signal);
        }
    })?;
    let dir = if path.is_dir() {
        path.clone()
    } else {
        path.parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    };
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    tracing::info!(path = %path.display(), watching = %dir.display(), "watching config");
    // An edit made after the first load and before the watch began has no event: read once
    // now (the same text as loaded is recognised and costs nothing).
    reload(&path, &reloader).await;
    while let Some(first) = rx.recv().await {
        if !settle(first, &mut rx).await {
            break;
        }
        reload(&path, &reloader).await;
    }
    drop(watcher);
    Ok(())
}

/// Reads `path` and applies it; reading and compiling take CPU and I/O, so off the request
/// workers.
async fn reload(path: &Path, reloader: &Arc<Reloader>) {
    let (file, r) = (path.to_path_buf(), Arc::clone(reloader));
    let done = tokio::task::spawn_blocking(move || match read_path(&file) {
        Ok(sources) => r.apply_logged(&file.display().to_string(), &sources),
        Err(e) => {
            tracing::warn!(path = %file.display(), error = %e, "cannot read config; still serving the previous tools")
        }
    })
    .await;
    if let Err(e) = done {
        tracing::error!(error = %e, "config reload task failed; still serving the previous tools");
    }
}
