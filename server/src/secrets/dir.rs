//! `dir:PATH`: `PATH/NAME/KEY` files (the layout of Secret volumes mounted under `PATH`),
//! watched with inotify.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::store::{Keys, MAX_DIR_SECRETS, MAX_KEYS, MAX_VALUE_BYTES, Secrets};
use crate::net::events::{classify, settle};

/// Every secret under `root`: its directories, and their files as keys (hidden names, and
/// files over [`MAX_VALUE_BYTES`], skipped).
fn read_dir_source(root: &Path) -> std::io::Result<Vec<(String, Keys)>> {
    let visible = |e: &std::fs::DirEntry| !e.file_name().to_string_lossy().starts_with('.');
    let mut out = Vec::new();
    for secret in std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .filter(visible)
        .take(MAX_DIR_SECRETS)
    {
        let path = secret.path();
        if !path.is_dir() {
            continue;
        }
        let name = secret.file_name().to_string_lossy().into_owned();
        let mut keys = Vec::new();
        for key in std::fs::read_dir(&path)?
            .filter_map(Result::ok)
            .filter(visible)
            .take(MAX_KEYS)
        {
            let p = key.path();
            let Ok(meta) = std::fs::metadata(&p) else { continue };
            if !meta.is_file() || meta.len() > MAX_VALUE_BYTES as u64 {
                continue;
            }
            if let Ok(bytes) = std::fs::read(&p) {
                keys.push((key.file_name().to_string_lossy().into_owned(), bytes));
            }
        }
        out.push((name, keys));
    }
    Ok(out)
}

/// `dir:PATH`: reads the tree now, then again on every change under it, until the process ends.
///
/// # Errors
/// The directory cannot be read or watched.
pub async fn watch_dir(root: PathBuf, secrets: Arc<Secrets>) -> anyhow::Result<()> {
    use notify::{RecursiveMode, Watcher};
    secrets.set_has_source();
    secrets.replace_all(read_dir_source(&root)?);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        // A value written in place is read once closed, never half-written.
        if let Some(signal) = ev.ok().and_then(|ev| classify(&ev.kind)) {
            let _ = tx.send(signal);
        }
    })?;
    watcher.watch(&root, RecursiveMode::Recursive)?;
    tracing::info!(path = %root.display(), "watching secrets");
    while let Some(first) = rx.recv().await {
        // The burst of events one rotation (a symlink swap) or write makes is one change.
        if !settle(first, &mut rx).await {
            break;
        }
        let (dir, store) = (root.clone(), Arc::clone(&secrets));
        let read = tokio::task::spawn_blocking(move || read_dir_source(&dir)).await;
        match read {
            Ok(Ok(all)) => {
                store.replace_all(all);
                tracing::info!(path = %root.display(), "secrets re-read");
            }
            Ok(Err(e)) => {
                tracing::warn!(path = %root.display(), error = %e, "cannot read secrets; keeping the previous values")
            }
            Err(e) => tracing::error!(error = %e, "secret read task failed"),
        }
        // A Secret volume mounted afresh replaces directories: watch what is there now.
        let _ = watcher.watch(&root, RecursiveMode::Recursive);
    }
    drop(watcher);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dir_source_reads_name_key_files_and_skips_hidden_and_large() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("api/..data")).unwrap();
        std::fs::write(d.path().join("api/token"), "abc").unwrap();
        std::fs::write(d.path().join("api/.hidden"), "x").unwrap();
        std::fs::write(d.path().join("loose-file"), "x").unwrap();
        let all = read_dir_source(d.path()).unwrap();
        assert_eq!(
            all,
            vec![("api".to_owned(), vec![("token".to_owned(), b"abc".to_vec())])]
        );
    }
}
