//! Tests of [`super::AppendFile`] and [`super::write_pieces`] against fake
//! files and the simulated disk.

use super::*;

/// A device behind a submission queue, as the real disk's executor keeps
/// one: writes issued during a round of the executor (here, a poll of
/// the test's future) reach the device only after that round.
#[derive(Default)]
struct QueueingFile {
    round: std::cell::Cell<u32>,
    /// Each write issued: its position and the round it was issued in.
    issued: std::cell::RefCell<Vec<(u64, u32)>>,
    /// A position whose write is refused for space, at once.
    refused_at: Option<u64>,
    /// The refusal's error number: `ENOSPC` when `None`.
    refused_with: Option<i32>,
    /// Every other write fails with `EIO`, and every failure is reported
    /// two rounds after its write was issued (as a device reports it).
    others_fail: bool,
}

impl BlockFile for QueueingFile {
    async fn write_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
        unreachable!("appends fill the device's buffer")
    }

    async fn write_with(&self, _: u64, _: usize, _: impl FnOnce(&mut [u8])) -> io::Result<()> {
        unreachable!("a durable append")
    }

    async fn write_durable_with(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> io::Result<()> {
        fill(&mut vec![0; len]);
        self.issued.borrow_mut().push((pos, self.round.get()));
        if self.others_fail {
            for _ in 0..2 {
                futures_lite::future::yield_now().await;
            }
        }
        if self.refused_at == Some(pos) {
            let errno = self.refused_with.unwrap_or(libc::ENOSPC);
            return Err(io::Error::from_raw_os_error(errno));
        }
        if self.others_fail {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    async fn write_cached_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
        Ok(())
    }

    async fn read_at(&self, _: u64, buf: &mut [u8]) -> io::Result<usize> {
        buf.fill(0);
        Ok(0)
    }

    async fn read_with<R>(
        &self,
        _: u64,
        len: usize,
        inspect: impl FnOnce(&[u8]) -> R,
    ) -> io::Result<R> {
        Ok(inspect(&vec![0; len]))
    }

    async fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(1 << 40)
    }

    async fn truncate(&self, _: u64) -> io::Result<()> {
        Ok(())
    }

    async fn reserve(&self, _: u64) -> io::Result<()> {
        Ok(())
    }

    async fn close(self) -> io::Result<()> {
        Ok(())
    }

    /// The next round: the queue has gone to the device by then.
    async fn issued_writes_submitted(&self) {
        futures_lite::future::yield_now().await;
    }
}

/// A large append's pieces are issued one round apart, each once the one
/// before it was submitted (so the device starts on the first while the
/// next is copied), and the work handed to `append_durable_then` runs
/// only after the round that submitted the last, before the append ends.
#[test]
fn pieces_go_out_one_round_apart_and_the_hook_runs_after_the_last() {
    let file = std::rc::Rc::new(QueueingFile::default());
    let hook_round = std::rc::Rc::new(std::cell::Cell::new(None));
    let mut append = futures_lite::future::block_on(AppendFile::open_at(file.clone(), 0)).unwrap();
    let hook = hook_round.clone();
    let observed = file.clone();
    let bytes = vec![7u8; 4 * PIECE_BYTES_MIN];
    let parts: [&[u8]; 1] = [&bytes];
    let mut write = std::pin::pin!(
        append.append_durable_then(&parts, move || { hook.set(Some(observed.round.get())) })
    );
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let result = loop {
        if let std::task::Poll::Ready(result) = std::future::Future::poll(write.as_mut(), &mut cx) {
            break result;
        }
        file.round.set(file.round.get() + 1);
        assert!(file.round.get() < 100, "never finished");
    };
    result.unwrap();
    let issued = file.issued.borrow().clone();
    assert_eq!(issued.len(), 4, "{issued:?}");
    for pair in issued.windows(2) {
        assert!(pair[0].0 < pair[1].0, "pieces in order: {issued:?}");
        assert!(
            pair[1].1 > pair[0].1,
            "a piece issued in the round of the one before it: {issued:?}"
        );
    }
    let last_round = issued[3].1;
    let hook_round = hook_round
        .get()
        .expect("the hook ran before the append ended");
    assert!(
        hook_round > last_round,
        "hook in round {hook_round}, the last piece issued in round {last_round}"
    );
}

/// A four-piece durable append to a file that refuses the write at
/// `refused_at`: its error, the positions it issued, and its length after.
fn append_refused_at(refused_at: u64) -> (io::Error, Vec<u64>, u64) {
    append_refused_with(refused_at, libc::ENOSPC)
}

/// [`append_refused_at`] with the refusal's error number.
fn append_refused_with(refused_at: u64, errno: i32) -> (io::Error, Vec<u64>, u64) {
    use futures_lite::future::block_on;
    let file = std::rc::Rc::new(QueueingFile {
        refused_at: Some(refused_at),
        refused_with: Some(errno),
        ..QueueingFile::default()
    });
    let mut append = block_on(AppendFile::open_at(file.clone(), 0)).unwrap();
    let bytes = vec![7u8; 4 * PIECE_BYTES_MIN];
    let err = block_on(append.append_durable(&[&bytes])).unwrap_err();
    let issued = file.issued.borrow().iter().map(|&(pos, _)| pos).collect();
    (err, issued, append.len())
}

/// Once a piece has failed, the pieces not issued yet are not issued: the
/// append has failed, and their bytes would only lie past the end the
/// caller rewinds to. A refusal after another piece was written is not
/// reported as a refusal: that piece's bytes are on the device.
#[test]
fn pieces_after_a_failed_one_are_not_issued() {
    let (err, issued, len) = append_refused_at(PIECE_BYTES_MIN as u64);
    assert_eq!(issued, [0, PIECE_BYTES_MIN as u64]);
    assert_eq!(len, 0);
    assert_ne!(err.kind(), io::ErrorKind::StorageFull, "{err}");
}

/// A refusal of the first piece stops the others before they are issued:
/// nothing of the append was written, and the caller hears the refusal.
#[test]
fn a_refused_first_piece_is_a_clean_refusal() {
    let (err, issued, len) = append_refused_at(0);
    assert_eq!(issued, [0]);
    assert_eq!(len, 0);
    assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
}

/// A full quota refuses as a full disk does: a clean refusal when nothing
/// else was written, and not one after another piece was.
#[test]
fn a_quota_refusal_is_a_refusal_for_space() {
    let (err, issued, len) = append_refused_with(0, libc::EDQUOT);
    assert_eq!((issued, len), (vec![0], 0));
    assert!(crate::out_of_space(&err), "{err}");
    assert_eq!(err.kind(), io::ErrorKind::QuotaExceeded, "{err}");
    let (err, _, _) = append_refused_with(PIECE_BYTES_MIN as u64, libc::EDQUOT);
    assert!(!crate::out_of_space(&err), "{err}");
}

/// A large durable append goes out in pieces; one refused for space and one
/// failed otherwise is reported as the other failure, since that piece's
/// blocks are unknown and a caller hearing "refused" would trust them.
#[test]
fn a_durable_append_reports_an_unknown_piece_before_a_refused_one() {
    futures_lite::future::block_on(async {
        // The first piece is refused, the second fails otherwise: both in
        // flight by the time the first reports.
        let refused_at = 0;
        let failing = QueueingFile {
            refused_at: Some(refused_at),
            others_fail: true,
            ..QueueingFile::default()
        };
        let mut file = AppendFile::open_at(failing, 0).await.unwrap();
        let err = file
            .append_durable(&[&vec![1u8; 4 * PIECE_BYTES_MIN]])
            .await
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
        assert_eq!(file.len(), 0);
    });
}

/// Rewound after an append of several blocks, the file holds its bytes up
/// to the mark again and zeros over every other block the append wrote,
/// and nothing past those blocks changes; at an aligned mark the block
/// before it is not written.
#[test]
fn a_rewound_append_is_zeroed_through_the_blocks_it_wrote() {
    use crate::file::OpenMode;
    use crate::sim::{SimDisk, SimFaults};
    use crate::Storage;

    for head in [0, 100, BLOCK_BYTES] {
        futures_lite::future::block_on(async {
            let disk = SimDisk::new(1, SimFaults::default());
            let file = disk.open("f", OpenMode::CreateOrOpen).await.unwrap();
            let mut file = AppendFile::open_at(file, 0).await.unwrap();
            file.append(&[&vec![1u8; head]]).await.unwrap();
            let mark = file.mark();
            file.append(&[&vec![2u8; 2 * BLOCK_BYTES + 300]])
                .await
                .unwrap();
            let written = file.len();
            let past = align_up(written);
            file.file()
                .write_at(past, &[3u8; BLOCK_BYTES])
                .await
                .unwrap();
            file.rewind(&mark);
            let before = disk.stats().bytes_written;
            file.rewrite_tail_zeroed_to(written).await.unwrap();
            assert_eq!(
                disk.stats().bytes_written - before,
                past - align_down(head as u64),
                "head {head}: from the mark's block through the append's last"
            );
            let contents = disk.contents("f").unwrap();
            assert!(contents[..head].iter().all(|&b| b == 1), "head {head}");
            assert!(
                contents[head..past as usize].iter().all(|&b| b == 0),
                "head {head}"
            );
            assert!(
                contents[past as usize..].iter().all(|&b| b == 3),
                "head {head}"
            );
            assert_eq!(contents.len() as u64, past + BLOCK_BYTES as u64);
            assert_eq!(file.len(), head as u64);
        });
    }
}

proptest::proptest! {
    /// Any window of an append's bytes (the rewritten head, the parts in
    /// order, then zeros), asked for at any position, is that window of
    /// their plain concatenation: across the head's end, part boundaries,
    /// empty parts and into the padding.
    #[test]
    fn an_append_is_its_head_then_its_parts_then_zeros(
        head in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        parts in proptest::collection::vec(
            proptest::collection::vec(proptest::prelude::any::<u8>(), 0..50), 0..5),
        from in 0usize..300,
        len in 0usize..300,
    ) {
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let data = Concat { head: &head, parts: &slices[..] };
        let mut plain = head.clone();
        plain.extend(parts.iter().flatten());
        plain.resize(plain.len() + 600, 0);
        let mut out = vec![0xEE; len];
        data.copy_to(from, &mut out);
        proptest::prop_assert_eq!(&out[..], &plain[from..from + len]);
        proptest::prop_assert_eq!(
            AppendSource::len(&slices[..]),
            parts.iter().map(Vec::len).sum::<usize>()
        );
    }
}
