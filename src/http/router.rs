//! Path and method matching: a route table of patterns such as
//! `/v1/topics/{topic}/produce`, each with one method and an endpoint.
//!
//! The table is small and fixed at startup, so matching walks it in order: a
//! linear scan over a few dozen patterns costs less than the hashing a tree would
//! need, and the answer does not depend on insertion order beyond "first match".
//! A path that matches a pattern but none of its methods answers 405 with the
//! `Allow` header, as the reference does; a path that matches no pattern answers
//! 404. `HEAD` is accepted wherever `GET` is (hyper drops the body).
//!
//! Segments are compared and captured as they arrive; the caller percent-decodes
//! a captured name (`/v1/topics/t%31` names topic `t1` on every route). A literal
//! segment never matches an encoded one, which no client sends for `v1` or
//! `topics`.
//!
//! Which cores: each shard builds its own table at startup and reads it on every
//! request; it is never changed afterwards.

use hyper::Method;

/// The most segments a pattern or a matched path may have.
pub const SEGMENTS_MAX: usize = 8;

/// A compiled route table mapping `(method, path)` to an endpoint `E`.
#[derive(Debug)]
pub struct Router<E> {
    routes: Vec<Route<E>>,
}

#[derive(Debug)]
struct Route<E> {
    method: Method,
    segments: Vec<Segment>,
    endpoint: E,
}

#[derive(Debug, PartialEq)]
enum Segment {
    Literal(&'static str),
    Param(&'static str),
}

/// Path parameters captured by a match, in pattern order.
#[derive(Debug, Default, PartialEq)]
pub struct Params<'p> {
    pairs: Vec<(&'static str, &'p str)>,
}

impl<'p> Params<'p> {
    /// The value captured for `{name}`.
    pub fn get(&self, name: &str) -> Option<&'p str> {
        self.pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

/// The outcome of routing one request.
#[derive(Debug, PartialEq)]
pub enum Match<'p, E> {
    Found {
        endpoint: E,
        params: Params<'p>,
    },
    /// The path exists but not with this method; `allow` lists the methods it has.
    MethodNotAllowed {
        allow: String,
    },
    NotFound,
}

impl<E: Copy> Router<E> {
    pub fn new() -> Self {
        Router { routes: Vec::new() }
    }

    /// Adds a route. Panics on a malformed pattern: patterns are constants in the
    /// code, so a bad one is a programming error found at startup.
    pub fn add(&mut self, method: Method, pattern: &'static str, endpoint: E) -> &mut Self {
        let segments = split(pattern)
            .map(
                |segment| match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some(name) => {
                        assert!(!name.is_empty(), "empty parameter in {pattern}");
                        Segment::Param(name)
                    }
                    None => {
                        assert!(!segment.is_empty(), "empty segment in {pattern}");
                        Segment::Literal(segment)
                    }
                },
            )
            .collect::<Vec<_>>();
        assert!(
            pattern.starts_with('/'),
            "pattern {pattern} is not absolute"
        );
        assert!(
            segments.len() <= SEGMENTS_MAX,
            "pattern {pattern} is too deep"
        );
        self.routes.push(Route {
            method,
            segments,
            endpoint,
        });
        self
    }

    /// Routes `method` and `path` (the URI path, without the query).
    pub fn find<'p>(&self, method: &Method, path: &'p str) -> Match<'p, E> {
        let Some(path_segments) = path.strip_prefix('/').map(|rest| rest.split('/')) else {
            return Match::NotFound;
        };
        let mut segments: [&str; SEGMENTS_MAX] = [""; SEGMENTS_MAX];
        let mut count = 0;
        for segment in path_segments {
            if count == SEGMENTS_MAX {
                return Match::NotFound;
            }
            segments[count] = segment;
            count += 1;
        }
        let segments = &segments[..count];
        let mut allowed: Vec<&Method> = Vec::new();
        for route in &self.routes {
            let Some(params) = capture(&route.segments, segments) else {
                continue;
            };
            let head_as_get = *method == Method::HEAD && route.method == Method::GET;
            if route.method == *method || head_as_get {
                return Match::Found {
                    endpoint: route.endpoint,
                    params,
                };
            }
            allowed.push(&route.method);
            if route.method == Method::GET {
                allowed.push(&Method::HEAD);
            }
        }
        if allowed.is_empty() {
            Match::NotFound
        } else {
            allowed.dedup();
            let allow = allowed
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            Match::MethodNotAllowed { allow }
        }
    }
}

impl<E: Copy> Default for Router<E> {
    fn default() -> Self {
        Self::new()
    }
}

fn split(pattern: &str) -> impl Iterator<Item = &str> {
    pattern.strip_prefix('/').unwrap_or(pattern).split('/')
}

fn capture<'p>(pattern: &[Segment], path: &[&'p str]) -> Option<Params<'p>> {
    if pattern.len() != path.len() {
        return None;
    }
    let mut params = Params::default();
    for (segment, value) in pattern.iter().zip(path) {
        match segment {
            Segment::Literal(literal) if literal == value => {}
            Segment::Literal(_) => return None,
            // An empty segment (`/v1/topics//produce`) never names anything.
            Segment::Param(_) if value.is_empty() => return None,
            Segment::Param(name) => params.pairs.push((name, value)),
        }
    }
    Some(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum E {
        Health,
        Produce,
        GetTopic,
        DeleteTopic,
    }

    fn router() -> Router<E> {
        let mut router = Router::new();
        router
            .add(Method::GET, "/healthz", E::Health)
            .add(Method::POST, "/v1/topics/{topic}/produce", E::Produce)
            .add(Method::GET, "/v1/topics/{topic}", E::GetTopic)
            .add(Method::DELETE, "/v1/topics/{topic}", E::DeleteTopic);
        router
    }

    #[test]
    fn literal_and_parameter_routes_match() {
        let router = router();
        assert_eq!(
            router.find(&Method::GET, "/healthz"),
            Match::Found {
                endpoint: E::Health,
                params: Params::default()
            }
        );
        let Match::Found { endpoint, params } =
            router.find(&Method::POST, "/v1/topics/orders.eu/produce")
        else {
            panic!("no match");
        };
        assert_eq!(endpoint, E::Produce);
        assert_eq!(params.get("topic"), Some("orders.eu"));
        assert_eq!(params.get("other"), None);
        assert!(matches!(
            router.find(&Method::DELETE, "/v1/topics/a"),
            Match::Found {
                endpoint: E::DeleteTopic,
                ..
            }
        ));
        assert!(matches!(
            router.find(&Method::HEAD, "/healthz"),
            Match::Found {
                endpoint: E::Health,
                ..
            }
        ));
    }

    #[test]
    fn unknown_paths_are_not_found() {
        let router = router();
        for path in [
            "/",
            "",
            "healthz",
            "/healthz/",
            "/healthzz",
            "/v1/topics",
            "/v1/topics//produce",
            "/v1/topics/a/produce/x",
            "/a/b/c/d/e/f/g/h/i/j",
        ] {
            assert_eq!(router.find(&Method::GET, path), Match::NotFound, "{path}");
        }
    }

    #[test]
    fn wrong_method_lists_the_allowed_ones() {
        let router = router();
        assert_eq!(
            router.find(&Method::POST, "/healthz"),
            Match::MethodNotAllowed {
                allow: "GET, HEAD".to_string()
            }
        );
        assert_eq!(
            router.find(&Method::PUT, "/v1/topics/a"),
            Match::MethodNotAllowed {
                allow: "GET, HEAD, DELETE".to_string()
            }
        );
        assert_eq!(
            router.find(&Method::GET, "/v1/topics/a/produce"),
            Match::MethodNotAllowed {
                allow: "POST".to_string()
            }
        );
    }

    #[test]
    #[should_panic(expected = "empty segment")]
    fn malformed_patterns_are_refused() {
        Router::new().add(Method::GET, "/v1//x", E::Health);
    }
}
