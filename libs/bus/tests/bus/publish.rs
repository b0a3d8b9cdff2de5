//! Publishing against a real nats-server with JetStream.
#![allow(clippy::unwrap_used)]

use runyard_bus::{Bus, StreamSettings, TraceParent};
use runyard_testkit::synth::{base_time, usage_event};
use runyard_testkit::{TestNats, decode_events, stream_messages, unique_namespace};

#[tokio::test]
async fn a_batch_confirmed_by_its_last_ack_lands_whole_and_in_order() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let bus = Bus::connect(&nats.url(), ns.clone(), "bus-test", false)
        .await
        .unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    let traceparent = TraceParent::new_root().header_value();

    assert!(
        bus.publish_confirming_last(Vec::new())
            .await
            .unwrap()
            .is_none()
    );

    let events: Vec<_> = (0..50)
        .map(|i| usage_event(1000 + i, base_time()))
        .collect();
    let batch: Vec<_> = events
        .iter()
        .map(|e| bus.prepare_event(e, &traceparent).unwrap())
        .collect();
    let stored = bus.publish_confirming_last(batch).await.unwrap().unwrap();
    assert_eq!(
        stored.sequence, 50,
        "the ack of the last is the 50th message"
    );
    assert!(!stored.duplicate);

    let client = async_nats::connect(nats.url()).await.unwrap();
    let msgs = stream_messages(&client, &ns.events_stream()).await;
    let ids: Vec<_> = decode_events(&msgs).into_iter().map(|e| e.id).collect();
    let sent: Vec<_> = events.iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, sent);
    // Every message carries its dedup id and trace context, acked or not.
    for (m, e) in msgs.iter().zip(&events) {
        let headers = m.headers.as_ref().unwrap();
        assert_eq!(headers.get("Nats-Msg-Id").unwrap().as_str(), e.id);
        assert!(headers.get(runyard_bus::TRACEPARENT_HEADER).is_some());
    }

    // The same batch again, built as it is sent: JetStream drops every
    // message as a duplicate.
    let again = events
        .iter()
        .map(|e| bus.prepare_event(e, &traceparent).unwrap());
    let stored = bus.publish_confirming_last(again).await.unwrap().unwrap();
    assert!(stored.duplicate);
    assert_eq!(
        stream_messages(&client, &ns.events_stream()).await.len(),
        50
    );
}
