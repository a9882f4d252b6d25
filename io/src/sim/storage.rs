//! [`SimDisk`] as a [`Storage`]: the namespace of files, durable as the
//! operations return; a crash that falls on one leaves its change made or
//! not (see [`SimDisk::tick_namespace`]).

use super::*;

impl Storage for SimDisk {
    type File = SimFile;

    async fn open(&self, path: &str, mode: OpenMode) -> io::Result<SimFile> {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        if inner.crashed {
            return Err(crashed_error());
        }
        if let Some((left, errno)) = inner.fail_next_opens {
            inner.fail_next_opens = (left > 1).then_some((left - 1, errno));
            return Err(io::Error::from_raw_os_error(errno));
        }
        let inode = match inner.names.get(path) {
            Some(&inode) => inode,
            None if mode == OpenMode::CreateOrOpen => {
                if !SimDisk::parent_exists(inner, path) {
                    return Err(io::Error::from_raw_os_error(libc::ENOENT));
                }
                let inode = inner.next_inode;
                let crashed = SimDisk::tick_namespace(inner);
                if crashed != Err(false) {
                    inner.next_inode += 1;
                    inner.inodes.insert(inode, FileData::default());
                    inner.names.insert(path.to_string(), inode);
                }
                if crashed.is_err() {
                    return Err(crashed_error());
                }
                if inner.fail_create_of.as_deref() == Some(path) {
                    inner.fail_create_of = None;
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
                inode
            }
            None => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
        };
        Ok(SimFile {
            disk: self.clone(),
            inode,
            generation: inner.generation,
        })
    }

    async fn size_of(&self, path: &str) -> io::Result<u64> {
        let inner = self.inner.borrow();
        if inner.crashed {
            return Err(crashed_error());
        }
        match inner.names.get(path) {
            Some(inode) => Ok(inner.inodes[inode].current.len() as u64),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    async fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut inner = self.inner.borrow_mut();
        if inner.crashed {
            return Err(crashed_error());
        }
        if !inner.names.contains_key(from) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let crashed = SimDisk::tick_namespace(&mut inner);
        if crashed != Err(false) {
            let inode = inner.names.remove(from).expect("checked above");
            inner.names.insert(to.to_string(), inode);
        }
        if crashed.is_err() {
            return Err(crashed_error());
        }
        if let Some((_, errno)) = inner.fail_rename_of.take_if(|(path, _)| path == from) {
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(())
    }

    /// Renames are durable as they return here: only a crashed disk fails.
    async fn sync_dir(&self, dir: &str) -> io::Result<()> {
        let inner = self.inner.borrow();
        if inner.crashed {
            return Err(crashed_error());
        }
        if !inner.dirs.contains(dir) && !dir.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        Ok(())
    }

    async fn remove(&self, path: &str) -> io::Result<()> {
        let mut inner = self.inner.borrow_mut();
        if inner.crashed {
            return Err(crashed_error());
        }
        if inner.fail_remove_of.as_deref() == Some(path) {
            inner.fail_remove_of = None;
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if !inner.names.contains_key(path) {
            return Ok(());
        }
        let crashed = SimDisk::tick_namespace(&mut inner);
        if crashed != Err(false) {
            inner.names.remove(path);
        }
        crashed.map_err(|_| crashed_error())
    }

    /// Each removal is a crash point; a crash on one leaves every removal of
    /// the batch so far (its directory not yet synced) made or undone, each
    /// by its own draw: looser than a journaling file system, which keeps a
    /// prefix of them, as a file system without a journal may.
    async fn remove_in(&self, dir: &str, names: &[String]) -> (usize, io::Result<()>) {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        if inner.crashed {
            return (0, Err(crashed_error()));
        }
        let mut unsynced: Vec<(String, u64)> = Vec::new();
        for (removed, name) in names.iter().enumerate() {
            let path = crate::file::join(dir, name);
            if inner.fail_remove_of.as_deref() == Some(path.as_str()) {
                inner.fail_remove_of = None;
                return (removed, Err(io::Error::from_raw_os_error(libc::EIO)));
            }
            let Some(inode) = inner.names.remove(&path) else {
                continue;
            };
            unsynced.push((path, inode));
            if SimDisk::tick_namespace(inner).is_err() {
                for (path, inode) in unsynced {
                    if inner.rng.random_bool(0.5) {
                        inner.names.insert(path, inode);
                    }
                }
                return (removed, Err(crashed_error()));
            }
        }
        let removed = names.len();
        if removed > 0 && inner.fail_dir_sync_of.as_deref() == Some(dir) {
            inner.fail_dir_sync_of = None;
            return (removed, Err(io::Error::from_raw_os_error(libc::EIO)));
        }
        (removed, Ok(()))
    }

    async fn create_dir_all(&self, path: &str) -> io::Result<()> {
        let mut inner = self.inner.borrow_mut();
        if inner.crashed {
            return Err(crashed_error());
        }
        let mut levels = Vec::new();
        let mut rel = String::new();
        for part in path.split('/') {
            rel = crate::file::join(&rel, part);
            levels.push(rel.clone());
        }
        if levels.iter().all(|level| inner.dirs.contains(level)) {
            return Ok(());
        }
        match SimDisk::tick_namespace(&mut inner) {
            Ok(()) | Err(true) => {}
            // Each level's entry is synced after the one above it: the
            // outer levels may be there, the inner ones not.
            Err(false) => {
                let kept = inner.rng.random_range(0..levels.len());
                inner.dirs.extend(levels.into_iter().take(kept));
                return Err(crashed_error());
            }
        }
        inner.dirs.extend(levels);
        if inner.crashed {
            return Err(crashed_error());
        }
        Ok(())
    }

    async fn remove_dir_all(&self, path: &str) -> io::Result<()> {
        let mut inner = self.inner.borrow_mut();
        if inner.crashed {
            return Err(crashed_error());
        }
        if !inner.dirs.contains(path) {
            return Ok(());
        }
        let prefix = format!("{path}/");
        match SimDisk::tick_namespace(&mut inner) {
            Ok(()) | Err(true) => {}
            // Its entry in the parent was not synced: the directory is back,
            // with whichever of its files' removals reached the disk undone.
            Err(false) => {
                let Inner { names, rng, .. } = &mut *inner;
                names.retain(|name, _| !name.starts_with(&prefix) || rng.random_bool(0.5));
                return Err(crashed_error());
            }
        }
        inner.names.retain(|name, _| !name.starts_with(&prefix));
        inner
            .dirs
            .retain(|dir| dir != path && !dir.starts_with(&prefix));
        if inner.crashed {
            return Err(crashed_error());
        }
        Ok(())
    }

    async fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let inner = self.inner.borrow();
        if inner.crashed {
            return Err(crashed_error());
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let direct_child = |path: &String| -> Option<String> {
            let rest = path.strip_prefix(&prefix)?;
            (!rest.is_empty() && !rest.contains('/')).then(|| rest.to_string())
        };
        let mut names: Vec<String> = inner
            .names
            .keys()
            .chain(inner.dirs.iter())
            .filter_map(direct_child)
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn space_left_bytes(&self) -> Option<u64> {
        let inner = self.inner.borrow();
        inner
            .capacity_bytes
            .map(|capacity| capacity.saturating_sub(SimDisk::used_bytes(&inner)))
    }
}
