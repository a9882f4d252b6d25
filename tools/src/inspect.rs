//! `narad inspect wal|log <dir>`: what is on disk, without changing it.
//!
//! Runs on one executor in the calling thread. It reads every segment of the
//! directory through the same O_DIRECT storage the broker uses, with the broker's
//! own decoders, and reports what recovery would find: the checkpoint, each
//! segment's sequence range, where its valid frames end, and any corruption.

use std::fmt::Write as _;
use std::path::Path;

use narad_io::dma::DmaStorage;
use narad_io::file::OpenMode;
use narad_io::{BlockFile, Storage};
use narad_shards::ids::{Offset, Seq};
use narad_shards::log::recovery::scan_tail;
use narad_shards::wal::checkpoint::{decode as decode_checkpoint, CHECKPOINT_FILE};
use narad_shards::wal::segment::{parse_segment_name, scan, ScanError, PREP_FILE, SPARE_PREFIX};

/// Index interval used only to drive the scan; the report does not use the index.
const SCAN_INDEX_INTERVAL_BYTES: u64 = 1 << 20;

/// Describes the ingress WAL in `dir`.
pub fn inspect_wal(dir: &Path) -> Result<String, String> {
    let storage = DmaStorage::new(dir);
    narad_io::rt::run_local(None, async move { wal_report(storage).await })
}

async fn wal_report(storage: DmaStorage) -> Result<String, String> {
    let names = storage.list("").await.map_err(|e| e.to_string())?;
    let mut out = String::new();
    let checkpoint = if names.iter().any(|n| n == CHECKPOINT_FILE) {
        let file = storage
            .open(CHECKPOINT_FILE, OpenMode::Existing)
            .await
            .map_err(|e| e.to_string())?;
        let mut block = vec![0u8; narad_io::BLOCK_BYTES];
        file.read_at(0, &mut block)
            .await
            .map_err(|e| e.to_string())?;
        decode_checkpoint(&block)
    } else {
        None
    };
    match checkpoint {
        Some(seq) => writeln!(out, "checkpoint: {seq}").ok(),
        None => writeln!(
            out,
            "checkpoint: absent or unreadable (dispatch would start at the oldest segment)"
        )
        .ok(),
    };
    let firsts: Vec<Seq> = names.iter().filter_map(|n| parse_segment_name(n)).collect();
    for (i, &first) in firsts.iter().enumerate() {
        let name = narad_shards::wal::segment::segment_name(first);
        let last_expected = firsts.get(i + 1).map(|next| Seq(next.0 - 1));
        let file = storage
            .open(&name, OpenMode::Existing)
            .await
            .map_err(|e| e.to_string())?;
        let size = file.size().await.map_err(|e| e.to_string())?;
        let line = match scan(&file, first, last_expected).await {
            Ok(end) => {
                let torn = end
                    .torn_until_bytes
                    .map(|until| format!(", torn write survives up to byte {until}"))
                    .unwrap_or_default();
                format!(
                    "{name}: seqs {first}..{} ({} records), valid bytes {} of {size}{torn}",
                    end.next_seq,
                    end.next_seq.0 - first.0,
                    end.end_bytes
                )
            }
            Err(ScanError::Corrupt {
                position_bytes,
                expected,
                why,
            }) => {
                format!(
                    "{name}: CORRUPT at byte {position_bytes} (expecting seq {expected}): {why}"
                )
            }
            Err(ScanError::Io(e)) => format!("{name}: read error: {e}"),
        };
        writeln!(out, "{line}").ok();
    }
    let spares = names
        .iter()
        .filter(|n| n.starts_with(SPARE_PREFIX) || *n == PREP_FILE)
        .count();
    writeln!(
        out,
        "segments: {}, spare or prepared files: {spares}",
        firsts.len()
    )
    .ok();
    Ok(out)
}

/// Describes the partition log in `dir`.
pub fn inspect_log(dir: &Path) -> Result<String, String> {
    let storage = DmaStorage::new(dir);
    narad_io::rt::run_local(None, async move { log_report(storage).await })
}

fn parse_log_name(name: &str) -> Option<Offset> {
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 20)
        .then(|| digits.parse().ok().map(Offset))
        .flatten()
}

async fn log_report(storage: DmaStorage) -> Result<String, String> {
    let names = storage.list("").await.map_err(|e| e.to_string())?;
    let mut out = String::new();
    let bases: Vec<Offset> = names.iter().filter_map(|n| parse_log_name(n)).collect();
    for base in &bases {
        let name = format!("{:020}.log", base.0);
        let file = storage
            .open(&name, OpenMode::Existing)
            .await
            .map_err(|e| e.to_string())?;
        let size = file.size().await.map_err(|e| e.to_string())?;
        let bytes = narad_io::append::read_exact_at(&file, 0, size as usize)
            .await
            .map_err(|e| e.to_string())?;
        let scan = scan_tail(&bytes, *base, SCAN_INDEX_INTERVAL_BYTES);
        let gaps = if scan.gaps.is_empty() {
            String::new()
        } else {
            format!(", CORRUPT ranges {:?}", scan.gaps)
        };
        writeln!(
            out,
            "{name}: offsets {}..{} ({} records), committed bytes {} of {size}{gaps}",
            base,
            scan.next_offset,
            scan.next_offset.0 - base.0,
            scan.data_bytes
        )
        .ok();
    }
    writeln!(out, "segments: {}", bases.len()).ok();
    Ok(out)
}
