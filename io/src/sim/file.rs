//! [`SimFile`]: writes, syncs and reads of one simulated file, under the crash
//! model the parent module describes.

use super::*;
use crate::file::BlockFile;
use crate::{align_down, is_aligned};

impl SimFile {
    /// Applies a write at once; returns whether it stays in flight for a turn.
    fn apply_write(&self, pos: u64, bytes: &[u8]) -> io::Result<bool> {
        assert!(is_aligned(pos) && is_aligned(bytes.len() as u64));
        let mut guard = self.disk.inner.borrow_mut();
        let inner = &mut *guard;
        SimDisk::check_handle(inner, self.generation)?;
        SimDisk::tick(inner)?;
        let end = pos as usize + bytes.len();
        let allocated = inner.inodes[&self.inode].allocated_bytes();
        if let Some(capacity) = inner.capacity_bytes {
            let grow = align_up(end as u64).saturating_sub(allocated);
            let used = SimDisk::used_bytes(inner);
            if grow > 0 && used + grow > capacity {
                let room = capacity.saturating_sub(used);
                // What fits: the blocks already allocated, then `room` more.
                let fits = align_down(
                    (allocated + room)
                        .saturating_sub(pos)
                        .min(bytes.len() as u64),
                );
                if !inner.short_writes || fits == 0 {
                    return Err(io::Error::from_raw_os_error(inner.refusal_errno));
                }
                drop(guard);
                self.apply_write(pos, &bytes[..fits as usize])?;
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("short write: {fits} of {} bytes", bytes.len()),
                ));
            }
        }
        let data = inner
            .inodes
            .get_mut(&self.inode)
            .expect("open inode exists");
        let sector = SECTOR_BYTES as u64;
        let sectors = pos / sector..(end as u64).div_ceil(sector);
        // A dirty sector written again keeps its unsynced bytes as a version
        // a crash may still leave.
        for s in sectors.clone() {
            if data.dirty_sectors.contains(&s) {
                let earlier = sector_bytes(&data.current, s).to_vec();
                let versions = data.versions.entry(s).or_default();
                if versions.last().map(|(_, bytes)| bytes) != Some(&earlier) {
                    data.version_seq += 1;
                    versions.push((data.version_seq, earlier));
                }
                if versions.len() > VERSIONS_MAX {
                    versions.remove(0);
                }
            }
        }
        if inner.slow_writes {
            for s in sectors.clone() {
                data.in_flight
                    .entry(s)
                    .or_insert_with(|| InFlightSector {
                        writes: 0,
                        completed: sector_bytes(&data.current, s).to_vec(),
                        versions_upto: data.version_seq,
                    })
                    .writes += 1;
            }
        }
        if data.current.len() < end {
            data.current.resize(end, 0);
            data.length_dirty = true;
        }
        data.current[pos as usize..end].copy_from_slice(bytes);
        if let Some((inode, at, bit)) = inner.flip_write_at {
            if inode == self.inode && (pos..end as u64).contains(&at) {
                data.current[at as usize] ^= 1 << bit;
                inner.flip_write_at = None;
            }
        }
        for s in sectors {
            data.dirty_sectors.insert(s);
            data.cached_sectors.remove(&s);
        }
        inner.stats.writes += 1;
        inner.stats.bytes_written += bytes.len() as u64;
        Ok(inner.slow_writes)
    }

    /// A sync of the dirty sectors in `sectors` (sector numbers): `sync_data`
    /// covers them all, a durable write just its own. Issued now, it covers the
    /// writes that returned before now, and no others.
    async fn sync_sectors(&self, sectors: std::ops::Range<u64>) -> io::Result<()> {
        // (sector, the bytes the sync makes durable, the newest version
        // number those bytes supersede)
        let covered: Vec<(u64, Vec<u8>, u64)> = {
            let mut guard = self.disk.inner.borrow_mut();
            let inner = &mut *guard;
            SimDisk::check_handle(inner, self.generation)?;
            SimDisk::tick(inner)?;
            let data = &inner.inodes[&self.inode];
            data.dirty_sectors
                .range(sectors.clone())
                .map(|&s| match data.in_flight.get(&s) {
                    Some(out) => (s, out.completed.clone(), out.versions_upto),
                    None => (s, sector_bytes(&data.current, s).to_vec(), data.version_seq),
                })
                .filter(|(_, bytes, _)| !bytes.is_empty())
                .collect()
        };
        let turns = {
            let mut inner = self.disk.inner.borrow_mut();
            inner.syncs_in_flight += 1;
            inner.stats.syncs_in_flight_max =
                inner.stats.syncs_in_flight_max.max(inner.syncs_in_flight);
            inner.sync_turns
        };
        // In flight: other tasks run, and may write (even over covered sectors).
        for _ in 0..turns {
            yield_once().await;
        }
        let mut guard = self.disk.inner.borrow_mut();
        let inner = &mut *guard;
        inner.syncs_in_flight -= 1;
        SimDisk::check_handle(inner, self.generation)?;
        let spontaneous = inner.faults.sync_eio_ppm > 0
            && inner.rng.random_range(0..1_000_000) < inner.faults.sync_eio_ppm;
        if inner.fail_next_syncs > 0 || spontaneous {
            inner.fail_next_syncs = inner.fail_next_syncs.saturating_sub(1);
            // What a failed flush leaves is unknown, sector by sector: some made it
            // to stable media, some still sit in the device's cache (a later flush
            // may persist them), and some the device dropped, so reads return the
            // old bytes. With O_DIRECT there is no page cache that could keep
            // serving bytes the device no longer has, so reads always show what the
            // device holds. A sector written through the page cache is either
            // durable or dropped, never pending: the kernel marks a page whose
            // writeback failed clean, so no later sync writes it again. (The page
            // may still hold the lost bytes; every read here is direct, and a
            // direct read shows the device's.)
            let Inner { rng, inodes, .. } = inner;
            let data = inodes.get_mut(&self.inode).expect("open inode exists");
            // A sector under a write still out keeps its fate for later: the
            // write lands after this sync whatever it reported.
            let dirty: Vec<u64> = data
                .dirty_sectors
                .range(sectors)
                .filter(|s| !data.in_flight.contains_key(s))
                .copied()
                .collect();
            for s in dirty {
                let start = (s as usize * SECTOR_BYTES).min(data.current.len());
                let end = (start + SECTOR_BYTES).min(data.current.len());
                let outcome = if data.cached_sectors.remove(&s) {
                    if rng.random_bool(0.5) {
                        0
                    } else {
                        2
                    }
                } else {
                    rng.random_range(0..3)
                };
                match outcome {
                    0 => {
                        if data.durable.len() < end {
                            data.durable.resize(end, 0);
                        }
                        data.durable[start..end].copy_from_slice(&data.current[start..end]);
                        data.dirty_sectors.remove(&s);
                        data.versions.remove(&s);
                    }
                    1 => {}
                    _ => {
                        for i in start..end {
                            data.current[i] = data.durable.get(i).copied().unwrap_or(0);
                        }
                        data.dirty_sectors.remove(&s);
                        data.versions.remove(&s);
                    }
                }
            }
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let data = inner
            .inodes
            .get_mut(&self.inode)
            .expect("open inode exists");
        // Copy only what changed since the last sync: segments are large and
        // syncs frequent, and a whole-file copy per sync dominates test time.
        // A covered sector written again while the sync ran stays dirty: its
        // newer bytes are not durable, though the covered ones are.
        for (s, bytes, superseded) in covered {
            let start = s as usize * SECTOR_BYTES;
            if data.durable.len() < start + bytes.len() {
                data.durable.resize(start + bytes.len(), 0);
            }
            data.durable[start..start + bytes.len()].copy_from_slice(&bytes);
            if sector_bytes(&data.current, s) == &bytes[..] {
                data.dirty_sectors.remove(&s);
                data.versions.remove(&s);
            }
            // Versions older than what is now durable can no longer come
            // back; those written over it later still can.
            if let Some(versions) = data.versions.get_mut(&s) {
                versions.retain(|&(seq, _)| seq > superseded);
                if versions.is_empty() {
                    data.versions.remove(&s);
                }
            }
        }
        if data.dirty_sectors.is_empty() {
            data.durable.resize(data.current.len(), 0);
            data.length_dirty = false;
        }
        Ok(())
    }
}

/// A write in flight; dropping it counts it landed.
struct Landing<'a> {
    file: &'a SimFile,
    sectors: std::ops::Range<u64>,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        let mut inner = self.file.disk.inner.borrow_mut();
        // After a reboot or a restart of the process the counts were cleared.
        if inner.generation != self.file.generation {
            return;
        }
        let data = inner
            .inodes
            .get_mut(&self.file.inode)
            .expect("open inode exists");
        for s in self.sectors.clone() {
            let out = data.in_flight.get_mut(&s).expect("counted at issue");
            out.writes -= 1;
            if out.writes == 0 {
                data.in_flight.remove(&s);
            }
        }
    }
}

impl BlockFile for SimFile {
    async fn write_at(&self, pos: u64, bytes: &[u8]) -> io::Result<()> {
        if self.apply_write(pos, bytes)? {
            // Lands when it returns, or when its caller drops it: the device
            // finishes a write whoever stopped waiting for it.
            let _landing = Landing {
                file: self,
                sectors: pos / SECTOR_BYTES as u64
                    ..(pos + bytes.len() as u64).div_ceil(SECTOR_BYTES as u64),
            };
            yield_once().await;
            SimDisk::check_handle(&self.disk.inner.borrow(), self.generation)?;
        }
        Ok(())
    }

    async fn write_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        // Stale bytes, as a device buffer may hold: a `fill` that leaves any
        // byte unset writes them.
        let mut data = vec![0xA5; len];
        fill(&mut data);
        self.write_at(pos, &data).await
    }

    /// The write, then a sync of just its sectors that is in flight for one turn
    /// of the executor like `sync_data`: a crash before it completes leaves any
    /// subset of them, and `EIO` from it leaves each one's fate unknown.
    ///
    /// A write that grows the file makes nothing past the old end durable: an
    /// `O_DSYNC` direct write that extends a file leaves its new size to the
    /// file system, which some kernels' ext4 did not make durable with it. Its
    /// sectors past the old end stay as an unsynced write's until a sync. (A
    /// durable write inside a size an earlier write set is durable whole: the
    /// sync it carries commits that size too.)
    async fn write_durable_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        let old_end = self.disk.inner.borrow().inodes[&self.inode].current.len() as u64;
        self.write_with(pos, len, fill).await?;
        let sector = SECTOR_BYTES as u64;
        let end = (pos + len as u64).div_ceil(sector).min(old_end / sector);
        self.sync_sectors(pos / sector..end.max(pos / sector))
            .await?;
        self.disk.inner.borrow_mut().stats.durable_writes += 1;
        Ok(())
    }

    /// A write like `write_at`: the model of writes not yet synced (any subset
    /// of their sectors survives a crash) is the page cache's too.
    async fn write_cached_at(&self, pos: u64, bytes: &[u8]) -> io::Result<()> {
        self.write_at(pos, bytes).await?;
        let mut inner = self.disk.inner.borrow_mut();
        inner.stats.cached_writes += 1;
        let data = inner
            .inodes
            .get_mut(&self.inode)
            .expect("open inode exists");
        let sector = SECTOR_BYTES as u64;
        for s in pos / sector..(pos + bytes.len() as u64).div_ceil(sector) {
            data.cached_sectors.insert(s);
        }
        Ok(())
    }

    async fn read_with<R>(
        &self,
        pos: u64,
        len: usize,
        inspect: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        let mut data = vec![0; len];
        self.read_at(pos, &mut data).await?;
        Ok(inspect(&data))
    }

    async fn read_at(&self, pos: u64, buf: &mut [u8]) -> io::Result<usize> {
        assert!(is_aligned(pos) && is_aligned(buf.len() as u64));
        let mut guard = self.disk.inner.borrow_mut();
        let inner = &mut *guard;
        SimDisk::check_handle(inner, self.generation)?;
        if inner.unreadable.contains(&self.inode) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let data = &inner.inodes[&self.inode];
        let start = (pos as usize).min(data.current.len());
        let end = (pos as usize + buf.len()).min(data.current.len());
        let n = end - start;
        buf[..n].copy_from_slice(&data.current[start..end]);
        buf[n..].fill(0);
        inner.stats.bytes_read += n as u64;
        let spontaneous = inner.faults.read_flip_ppm > 0
            && inner.rng.random_range(0..1_000_000) < inner.faults.read_flip_ppm;
        let forced = inner.flip_next_reads > 0;
        if (forced || spontaneous) && n > 0 {
            if forced {
                inner.flip_next_reads -= 1;
            }
            let byte = inner.rng.random_range(0..n);
            let bit = inner.rng.random_range(0..8);
            buf[byte] ^= 1 << bit;
        }
        if let Some(&(inode, at, bit, read_bytes_max)) = inner.flip_at.front() {
            if inode == self.inode
                && buf.len() <= read_bytes_max
                && (pos..pos + n as u64).contains(&at)
            {
                inner.flip_at.pop_front();
                buf[(at - pos) as usize] ^= 1 << bit;
            }
        }
        Ok(n)
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.sync_sectors(0..u64::MAX).await?;
        self.disk.inner.borrow_mut().stats.syncs += 1;
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        let inner = self.disk.inner.borrow();
        SimDisk::check_handle(&inner, self.generation)?;
        Ok(inner.inodes[&self.inode].current.len() as u64)
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        let mut guard = self.disk.inner.borrow_mut();
        let inner = &mut *guard;
        SimDisk::check_handle(inner, self.generation)?;
        SimDisk::tick(inner)?;
        let data = inner
            .inodes
            .get_mut(&self.inode)
            .expect("open inode exists");
        if (len as usize) > data.current.len() {
            // Growing writes zeros: model them as written sectors.
            let sector = SECTOR_BYTES as u64;
            let from = data.current.len() as u64 / sector;
            data.current.resize(len as usize, 0);
            for s in from..len.div_ceil(sector) {
                data.dirty_sectors.insert(s);
            }
        } else {
            data.current.truncate(len as usize);
            // Cutting a file frees its blocks past the new end, reserved ones
            // too.
            data.reserved = data.reserved.min(align_up(len));
            // Sectors wholly past the new end hold nothing a sync could make
            // durable: the next sync makes the shorter length durable. (A write
            // still in flight there keeps its record until it lands, before-
            // truncate bytes included: a write that grew the file back over
            // that sector before then would share it. No caller does: the log
            // waits for its zero chunks before it trims.)
            let first_gone = (len as usize).div_ceil(SECTOR_BYTES) as u64;
            data.versions.retain(|&s, _| s < first_gone);
            data.dirty_sectors.retain(|&s| s < first_gone);
            data.cached_sectors.retain(|&s| s < first_gone);
        }
        data.length_dirty = true;
        Ok(())
    }

    async fn reserve(&self, len: u64) -> io::Result<()> {
        let mut guard = self.disk.inner.borrow_mut();
        let inner = &mut *guard;
        SimDisk::check_handle(inner, self.generation)?;
        SimDisk::tick(inner)?;
        if inner.reserve_unsupported {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        let grow = align_up(len).saturating_sub(inner.inodes[&self.inode].allocated_bytes());
        if grow == 0 {
            return Ok(());
        }
        let used = SimDisk::used_bytes(inner);
        let data = inner
            .inodes
            .get_mut(&self.inode)
            .expect("open inode exists");
        match inner.capacity_bytes {
            // As ext4 does, it allocates what is left before it fails, and
            // keeps it: cutting the file to its size gives it back.
            Some(capacity) if used + grow > capacity => {
                let left = align_down(capacity.saturating_sub(used));
                data.reserved = data.allocated_bytes() + left;
                Err(io::Error::from_raw_os_error(inner.refusal_errno))
            }
            _ => {
                data.reserved = data.reserved.max(align_up(len));
                Ok(())
            }
        }
    }

    async fn close(self) -> io::Result<()> {
        Ok(())
    }
}
