//! [`SimDisk`] as a [`Storage`]: the namespace of files, durable as the
//! operations return.

use super::*;

impl Storage for SimDisk {
    type File = SimFile;

    async fn open(&self, path: &str, mode: OpenMode) -> io::Result<SimFile> {
        let mut guard = self.inner.borrow_mut();
        let inner = &mut *guard;
        if inner.crashed {
            return Err(crashed_error());
        }
        let inode = match inner.names.get(path) {
            Some(&inode) => inode,
            None if mode == OpenMode::CreateOrOpen => {
                if !SimDisk::parent_exists(inner, path) {
                    return Err(io::Error::from_raw_os_error(libc::ENOENT));
                }
                let inode = inner.next_inode;
                inner.next_inode += 1;
                inner.inodes.insert(inode, FileData::default());
                inner.names.insert(path.to_string(), inode);
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

    async fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut inner = self.inner.borrow_mut();
        if inner.crashed {
            return Err(crashed_error());
        }
        let inode = inner
            .names
            .remove(from)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        inner.names.insert(to.to_string(), inode);
        if inner.fail_rename_of.as_deref() == Some(from) {
            inner.fail_rename_of = None;
            return Err(io::Error::from_raw_os_error(libc::EIO));
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
        inner.names.remove(path);
        Ok(())
    }

    async fn remove_in(&self, dir: &str, names: &[String]) -> (usize, io::Result<()>) {
        let mut removed = 0;
        for name in names {
            if let Err(e) = self.remove(&crate::file::join(dir, name)).await {
                return (removed, Err(e));
            }
            removed += 1;
        }
        let mut inner = self.inner.borrow_mut();
        if inner.crashed {
            return (removed, Err(crashed_error()));
        }
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
        let mut rel = String::new();
        for part in path.split('/') {
            rel = crate::file::join(&rel, part);
            inner.dirs.insert(rel.clone());
        }
        Ok(())
    }

    async fn remove_dir_all(&self, path: &str) -> io::Result<()> {
        let mut inner = self.inner.borrow_mut();
        if inner.crashed {
            return Err(crashed_error());
        }
        let prefix = format!("{path}/");
        inner.names.retain(|name, _| !name.starts_with(&prefix));
        inner
            .dirs
            .retain(|dir| dir != path && !dir.starts_with(&prefix));
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
