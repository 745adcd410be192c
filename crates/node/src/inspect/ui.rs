//! The web view at `/ui` on the metrics address: one page, embedded in
//! the binary (no CDN: clusters are often offline), that reads the
//! introspection API and polls it for live updates. Pages (by the URL's
//! fragment): the overview (syncs and foreign changes), the Service list
//! (search, pages of 50, counters), one Service (entry points, endpoints
//! with their state and connection rate, kernel elements, drift, a link to
//! its flows), the flow stream (`--flows`: filters, newest first, asked for
//! every second) and the trace form.

use verdict_admin::Response;
use verdict_admin::http::Request;

/// The page, HTML, CSS and script in one.
const PAGE: &str = include_str!("ui/index.html");

/// `GET /ui` (every path under it is the same page: the fragment routes).
pub fn page(req: &Request) -> Response {
    if req.method != "GET" && req.method != "HEAD" {
        return Response::text(405, "only GET\n".into(), "text/plain; charset=utf-8");
    }
    let mut r = Response::text(200, PAGE.to_owned(), "text/html; charset=utf-8");
    r.headers.push(("Cache-Control", "no-cache".into()));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_served_whole_and_needs_nothing_from_outside() {
        let r = page(&Request::get("/ui"));
        assert_eq!(r.code, 200);
        let body = r.text_body();
        assert!(body.starts_with("<!doctype html>"));
        assert!(body.trim_end().ends_with("</html>"));
        for route in [
            "#/services",
            "#/trace",
            "#/flows",
            "\"/flows?\"",
            "const API = \"/api/v1\"",
            "\"/problems\"",
            "\"/syncs\"",
        ] {
            assert!(body.contains(route), "{route}");
        }
        assert!(
            !body.contains("http://") && !body.contains("https://"),
            "no outside assets"
        );
    }
}
