//! The futures of the hot paths stay small: a read's future is moved into
//! every consume's, and each is allocated and copied per request. Opening a
//! closed log and closing a poisoned one are rare and their futures large, so
//! they are boxed where they happen rather than carried by every read.

use std::sync::Arc;

use narad_io::sim::{SimDisk, SimFaults};
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::{LogConfig, ReadRange};
use narad_shards::produce::Owner;

#[test]
fn a_reads_future_does_not_carry_the_open_of_a_log() {
    let disk = SimDisk::new(1, SimFaults::default());
    let live = Box::new(|_: &str, _: IncarnationId, _: PartitionId| true);
    let owner = Owner::new(disk, LogConfig::default(), live);
    let topic: Arc<str> = Arc::from("t");
    let read = owner.read(
        &topic,
        IncarnationId(1),
        PartitionId(0),
        ReadRange::new(Offset(0), 1, 1 << 20),
    );
    let size = std::mem::size_of_val(&read);
    println!("a read's future: {size} bytes");
    // About 2.3 KB here (a debug build over the simulated disk; 3.7 KB in
    // a release build over the real one), and about 4 KB with the open
    // carried inline.
    assert!(size <= 3072, "a read's future is {size} bytes");
}
