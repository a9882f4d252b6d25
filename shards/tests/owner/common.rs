//! What the owner tests share: the topic they commit to, a commit that waits
//! for the owner's answer, and a read of every payload back.

use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use futures_channel::oneshot;
use narad_io::Storage;
use narad_shards::ids::{IncarnationId, Offset, PartitionId};
use narad_shards::log::{ReadItem, ReadRange};
use narad_shards::produce::{CommitError, OwnedPartition, OwnedRecord, Owner};

/// The topic every owner test commits to.
pub const TOPIC: &str = "orders";

pub fn topic() -> Arc<str> {
    Arc::from(TOPIC)
}

/// Partition `partition` of the incarnation `id` of [`TOPIC`].
pub fn owned(id: IncarnationId, partition: u32) -> OwnedPartition {
    OwnedPartition {
        topic: topic(),
        incarnation: id,
        partition: PartitionId(partition),
    }
}

/// One keyless record per payload.
pub fn keyless(payloads: &[String]) -> Vec<OwnedRecord> {
    payloads
        .iter()
        .map(|p| OwnedRecord {
            key: None,
            payload: p.clone().into_bytes().into(),
            mask: 0,
        })
        .collect()
}

/// Commits one keyless record per payload and returns what the owner answered.
pub async fn try_commit<S: Storage>(
    owner: &Rc<Owner<S>>,
    id: IncarnationId,
    partition: u32,
    payloads: &[String],
) -> Result<Range<Offset>, CommitError> {
    let (reply, answer) = oneshot::channel();
    owner.commit(
        topic(),
        id,
        PartitionId(partition),
        keyless(payloads),
        reply,
    );
    answer.await.expect("the owner answers")
}

/// Every payload of partition `partition` of incarnation `id`, in offset order,
/// as text.
pub async fn payloads_of<S: Storage>(
    owner: &Rc<Owner<S>>,
    id: IncarnationId,
    partition: u32,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = Offset(0);
    loop {
        let range = ReadRange::new(at, 64, 1 << 20);
        let batch = (owner
            .read(&topic(), id, PartitionId(partition), range)
            .await)
            .expect("read");
        if batch.items.is_empty() {
            return out;
        }
        for item in batch.items {
            match item {
                ReadItem::Record(r) => {
                    at = Offset(r.offset.0 + 1);
                    out.push(String::from_utf8(r.payload.to_vec()).unwrap());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}
