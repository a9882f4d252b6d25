//! Tests of the routes: health, readiness, the route table.

use super::*;
use http_body_util::BodyExt;

fn api(node: Arc<NodeState>) -> Rc<Api> {
    Rc::new(Api {
        node,
        topic_defaults: crate::config::Config::default().topic,
        consume_wait_max: std::time::Duration::from_secs(10),
        body_read_timeout: std::time::Duration::from_secs(30),
        broker: RefCell::new(None),
    })
}

fn call(routes: &Routes, method: Method, path: &str) -> (StatusCode, String) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let handling = routes.handle(request);
    // Routes box their futures, so what hyper moves per request stays small.
    assert!(std::mem::size_of_val(&handling) <= 2048);
    let response = futures_lite::future::block_on(handling);
    let status = response.status();
    let body = futures_lite::future::block_on(response.into_body().collect())
        .unwrap()
        .to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[test]
fn every_status_the_api_answers_is_its_own_label() {
    for code in [
        200, 201, 202, 204, 400, 401, 403, 404, 405, 408, 409, 410, 413, 415, 417, 422, 429, 431,
        499, 500, 501, 502, 503, 504,
    ] {
        let status = StatusCode::from_u16(code).unwrap();
        assert_eq!(status_label(status), code.to_string());
    }
    assert_eq!(status_label(StatusCode::IM_A_TEAPOT), "other");
}

#[test]
fn health_and_readiness_follow_the_node() {
    let node = Arc::new(NodeState::new(4));
    let routes = Routes::new(api(node.clone()));
    assert_eq!(
        call(&routes, Method::GET, "/healthz"),
        (StatusCode::OK, r#"{"status":"ok"}"#.to_string())
    );
    let (status, body) = call(&routes, Method::GET, "/readyz");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with(r#"{"error":"#), "{body}");
    node.set_ready();
    assert_eq!(
        call(&routes, Method::GET, "/readyz"),
        (StatusCode::OK, r#"{"status":"ready"}"#.to_string())
    );
    // Produces refused for want of disk: ready, degraded, until it passes.
    let gib = 1 << 30;
    assert!(node.note_disk(0, 100 * gib));
    assert_eq!(
        call(&routes, Method::GET, "/readyz"),
        (
            StatusCode::OK,
            r#"{"status":"ready","degraded":["data_dir_low"]}"#.to_string()
        )
    );
    assert!(!node.note_disk(50 * gib, 100 * gib));
    assert_eq!(
        call(&routes, Method::GET, "/readyz").1,
        r#"{"status":"ready"}"#
    );
    // Consumer offsets that fail to persist: ready, degraded, until they
    // persist again.
    node.note_consumer_state_failing(true);
    assert_eq!(
        call(&routes, Method::GET, "/readyz"),
        (
            StatusCode::OK,
            r#"{"status":"ready","degraded":["consumer_offsets_failing"]}"#.to_string()
        )
    );
    node.note_consumer_state_failing(false);
    assert_eq!(
        call(&routes, Method::GET, "/readyz").1,
        r#"{"status":"ready"}"#
    );
    // A WAL checkpoint that cannot be made durable: the same.
    let checkpoint = std::cell::Cell::new(false);
    node.note_checkpoint_failing(&checkpoint, true);
    node.note_checkpoint_failing(&checkpoint, true);
    assert_eq!(
        call(&routes, Method::GET, "/readyz").1,
        r#"{"status":"ready","degraded":["wal_checkpoint_failing"]}"#
    );
    node.note_checkpoint_failing(&checkpoint, false);
    assert_eq!(
        call(&routes, Method::GET, "/readyz").1,
        r#"{"status":"ready"}"#
    );
    // A WAL waiting on a disk that stopped answering: not ready until it
    // answers.
    let stalled = std::cell::Cell::new(false);
    let waited = |s| Some(std::time::Duration::from_secs(s));
    assert!(!node.note_wal_wait(0, &stalled, waited(1), false));
    assert_eq!(call(&routes, Method::GET, "/readyz").0, StatusCode::OK);
    assert!(node.note_wal_wait(0, &stalled, waited(6), false));
    assert!(
        node.note_wal_wait(0, &stalled, waited(7), false),
        "counted once"
    );
    let (status, body) = call(&routes, Method::GET, "/readyz");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.contains("waited several seconds for the disk"),
        "{body}"
    );
    assert!(!node.note_wal_wait(0, &stalled, None, false));
    assert_eq!(
        call(&routes, Method::GET, "/readyz").1,
        r#"{"status":"ready"}"#
    );
    // A stall that ends in a failed write: not ready, for the latch.
    assert!(node.note_wal_wait(0, &stalled, waited(9), false));
    assert!(!node.note_wal_wait(0, &stalled, None, true));
    let (status, body) = call(&routes, Method::GET, "/readyz");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("ingress WAL failed"), "{body}");
    // A latched WAL: not ready, for good; alive all the same.
    node.note_wal_failed();
    let (status, body) = call(&routes, Method::GET, "/readyz");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("ingress WAL failed"), "{body}");
    assert_eq!(call(&routes, Method::GET, "/healthz").0, StatusCode::OK);
    node.start_draining();
    for path in ["/healthz", "/readyz", "/nowhere"] {
        let (status, body) = call(&routes, Method::GET, path);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, r#"{"error":"shutting down"}"#);
    }
}

#[test]
fn unknown_routes_and_methods_are_plain_text() {
    let routes = Routes::new(api(Arc::new(NodeState::new(4))));
    assert_eq!(
        call(&routes, Method::GET, "/v1/nothing"),
        (StatusCode::NOT_FOUND, "404 page not found\n".to_string())
    );
    assert_eq!(
        call(&routes, Method::POST, "/healthz"),
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed\n".to_string()
        )
    );
}

#[test]
fn state_changing_requests_pass_the_content_type_guard_first() {
    let mut routes = Routes::new(api(Arc::new(NodeState::new(4))));
    // No POST endpoint exists yet; borrow the health endpoint to see the guard.
    routes.router.add(Method::POST, "/probe", Endpoint::Healthz);
    let post = |content_type: Option<&str>| {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri("/probe")
            .header("host", "test");
        if let Some(value) = content_type {
            request = request.header("content-type", value);
        }
        let response = futures_lite::future::block_on(
            routes.handle(
                request
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap(),
            ),
        );
        response.status()
    };
    assert_eq!(post(None), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(post(Some("text/plain")), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(post(Some("application/json")), StatusCode::OK);
}
