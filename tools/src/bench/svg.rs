//! Line charts as inline SVG, for the `--report` page: axes with ticks, a
//! grid, one polyline per series and a legend.
//!
//! Which cores: the caller's thread, after the run; pure functions.
//!
//! Hand-written rather than a plotting library, because the page must open
//! with no network and the generator should not carry a charting dependency
//! for four charts. The SVG is written without an `xmlns` attribute: inside
//! HTML the parser knows the element, and the page then names no URL at all.
//! Every text that reaches the markup goes through [`escape`].

use std::fmt::Write as _;

/// The chart's size in pixels, and the margins that hold the axes' labels.
const WIDTH_PX: f64 = 820.0;
const HEIGHT_PX: f64 = 300.0;
const LEFT_PX: f64 = 72.0;
const RIGHT_PX: f64 = 16.0;
const TOP_PX: f64 = 28.0;
const BOTTOM_PX: f64 = 44.0;
const PLOT_WIDTH_PX: f64 = WIDTH_PX - LEFT_PX - RIGHT_PX;
const PLOT_HEIGHT_PX: f64 = HEIGHT_PX - TOP_PX - BOTTOM_PX;
/// The most ticks an axis draws: more would make the labels collide.
pub const TICKS_MAX: usize = 12;

const _: () = assert!(LEFT_PX + RIGHT_PX < WIDTH_PX && TOP_PX + BOTTOM_PX < HEIGHT_PX);

/// How values map onto an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Decades equally spaced; values at or below zero sit on the axis.
    Log10,
}

/// One axis: its range, scale and labelled ticks.
#[derive(Clone, Debug)]
pub struct Axis {
    pub label: String,
    pub scale: Scale,
    pub min: f64,
    pub max: f64,
    pub ticks: Vec<(f64, String)>,
}

impl Axis {
    /// A linear axis from 0 to a round number at or above `max`, with ticks
    /// at steps of 1, 2 or 5 times a power of ten, labelled by `name`.
    pub fn linear_from_zero(label: &str, max: f64, name: fn(f64) -> String) -> Axis {
        let max = if max.is_finite() && max > 0.0 {
            max
        } else {
            1.0
        };
        let step = round_step(max / 5.0);
        let top = (max / step).ceil() * step;
        let ticks = (0..=TICKS_MAX)
            .map(|i| i as f64 * step)
            .take_while(|v| *v <= top * (1.0 + 1e-9))
            .map(|v| (v, name(v)))
            .collect();
        Axis {
            label: label.into(),
            scale: Scale::Linear,
            min: 0.0,
            max: top,
            ticks,
        }
    }

    /// A log axis over whole decades around `low..=high` (at least 1), with
    /// a tick at each decade, labelled by `name`.
    pub fn log_decades(label: &str, low: f64, high: f64, name: fn(f64) -> String) -> Axis {
        let low = if low.is_finite() && low >= 1.0 {
            low
        } else {
            1.0
        };
        let high = if high.is_finite() && high > low {
            high
        } else {
            low * 10.0
        };
        let first = low.log10().floor() as i32;
        let last = (high.log10().ceil() as i32).max(first + 1);
        // Skip decades so that the ticks stay within bounds.
        let every = (((last - first) as usize).div_ceil(TICKS_MAX)).max(1);
        let ticks = (first..=last)
            .step_by(every)
            .map(|d| 10f64.powi(d))
            .map(|v| (v, name(v)))
            .collect();
        Axis {
            label: label.into(),
            scale: Scale::Log10,
            min: 10f64.powi(first),
            max: 10f64.powi(last),
            ticks,
        }
    }

    /// Where `value` falls, from 0 (the minimum) to 1 (the maximum), clamped.
    fn fraction(&self, value: f64) -> f64 {
        let (value, min, max) = match self.scale {
            Scale::Linear => (value, self.min, self.max),
            Scale::Log10 => (
                value.max(self.min).log10(),
                self.min.log10(),
                self.max.log10(),
            ),
        };
        assert!(max > min, "an axis spans a range");
        ((value - min) / (max - min)).clamp(0.0, 1.0)
    }
}

/// 1, 2 or 5 times a power of ten, the smallest at or above `raw`.
fn round_step(raw: f64) -> f64 {
    assert!(raw > 0.0 && raw.is_finite());
    let decade = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|step| *step >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * decade)
}

/// One series of a chart.
#[derive(Clone, Debug)]
pub struct Line {
    pub name: String,
    /// A CSS colour.
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// A titled chart of lines over two axes.
#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    pub lines: Vec<Line>,
}

impl Chart {
    /// The chart as an `<svg>` element.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            r#"<svg class="chart" viewBox="0 0 {WIDTH_PX} {HEIGHT_PX}" width="{WIDTH_PX}" height="{HEIGHT_PX}" role="img" aria-label="{}">"#,
            escape(&self.title)
        );
        let _ = write!(
            out,
            r#"<text x="{LEFT_PX}" y="18" class="title">{}</text>"#,
            escape(&self.title)
        );
        self.axes(&mut out);
        for line in &self.lines {
            out.push_str(r#"<polyline fill="none" stroke-width="1.5" stroke=""#);
            out.push_str(line.color);
            out.push_str(r#"" points=""#);
            for (i, (x, y)) in line.points.iter().enumerate() {
                let sep = if i > 0 { " " } else { "" };
                let _ = write!(out, "{sep}{:.1},{:.1}", self.px(*x), self.py(*y));
            }
            out.push_str(r#""><title>"#);
            out.push_str(&escape(&line.name));
            out.push_str("</title></polyline>");
        }
        self.legend(&mut out);
        out.push_str("</svg>");
        out
    }

    /// The pixel column of `x` and the pixel row of `y`.
    fn px(&self, x: f64) -> f64 {
        LEFT_PX + self.x.fraction(x) * PLOT_WIDTH_PX
    }

    fn py(&self, y: f64) -> f64 {
        TOP_PX + (1.0 - self.y.fraction(y)) * PLOT_HEIGHT_PX
    }

    /// The plot's frame, its grid lines with their tick labels, and the axes'
    /// labels.
    fn axes(&self, out: &mut String) {
        let (plot_w, plot_h) = (PLOT_WIDTH_PX, PLOT_HEIGHT_PX);
        let _ = write!(
            out,
            r##"<rect x="{LEFT_PX}" y="{TOP_PX}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>"##
        );
        for (value, name) in &self.x.ticks {
            let x = self.px(*value);
            let _ = write!(
                out,
                r##"<line x1="{x:.1}" y1="{TOP_PX}" x2="{x:.1}" y2="{:.1}" stroke="#e4e4e4"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP_PX + plot_h,
                TOP_PX + plot_h + 16.0,
                escape(name)
            );
        }
        for (value, name) in &self.y.ticks {
            let y = self.py(*value);
            let _ = write!(
                out,
                r##"<line x1="{LEFT_PX}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT_PX + plot_w,
                LEFT_PX - 6.0,
                y + 4.0,
                escape(name)
            );
        }
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT_PX + plot_w / 2.0,
            HEIGHT_PX - 6.0,
            escape(&self.x.label)
        );
        let middle = TOP_PX + plot_h / 2.0;
        let _ = write!(
            out,
            r#"<text x="14" y="{middle:.1}" text-anchor="middle" transform="rotate(-90 14 {middle:.1})">{}</text>"#,
            escape(&self.y.label)
        );
    }

    /// The series' names in their colours, along the top right.
    fn legend(&self, out: &mut String) {
        let mut x = WIDTH_PX - RIGHT_PX;
        for line in self.lines.iter().rev() {
            let width = 7.0 * line.name.chars().count() as f64 + 18.0;
            x -= width;
            let _ = write!(
                out,
                r#"<rect x="{x:.1}" y="10" width="10" height="10" fill="{}"/><text x="{:.1}" y="19">{}</text>"#,
                line.color,
                x + 13.0,
                escape(&line.name)
            );
        }
    }
}

/// Text made safe for HTML and SVG markup, in content and in attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(v: f64) -> String {
        format!("{v}")
    }

    #[test]
    fn linear_axes_end_on_a_round_step() {
        let axis = Axis::linear_from_zero("msg/s", 4300.0, plain);
        assert_eq!(axis.max, 5000.0);
        let values: Vec<f64> = axis.ticks.iter().map(|t| t.0).collect();
        assert_eq!(values, [0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0]);
        assert_eq!(round_step(0.3), 0.5);
        assert_eq!(round_step(7.0), 10.0);
        assert_eq!(round_step(200.0), 200.0);
        // Nothing measured still gives an axis.
        assert_eq!(Axis::linear_from_zero("x", 0.0, plain).max, 1.0);
    }

    #[test]
    fn log_axes_cover_whole_decades() {
        let axis = Axis::log_decades("latency", 150.0, 20_000.0, plain);
        assert_eq!((axis.min, axis.max), (100.0, 100_000.0));
        assert_eq!(axis.ticks.len(), 4);
        assert_eq!(axis.fraction(1000.0), 1.0 / 3.0);
        assert_eq!(axis.fraction(0.0), 0.0);
        assert_eq!(axis.fraction(1e9), 1.0);
        let wide = Axis::log_decades("latency", 1.0, 1e30, plain);
        assert!(wide.ticks.len() <= TICKS_MAX + 1, "{:?}", wide.ticks);
    }

    #[test]
    fn a_chart_draws_each_line_and_escapes_its_text() {
        let chart = Chart {
            title: "a <b> & c".into(),
            x: Axis::linear_from_zero("s", 2.0, plain),
            y: Axis::linear_from_zero("n", 10.0, plain),
            lines: vec![
                Line {
                    name: "up".into(),
                    color: "#c00",
                    points: vec![(0.0, 0.0), (2.0, 10.0)],
                },
                Line {
                    name: "flat".into(),
                    color: "#00c",
                    points: vec![(0.0, 5.0), (2.0, 5.0)],
                },
            ],
        };
        let svg = chart.render();
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<polyline ").count(), 2);
        assert!(svg.contains("a &lt;b&gt; &amp; c"), "{svg}");
        assert!(!svg.contains("<b>"));
        // The rising line runs from the bottom left to the top right corner.
        let left_bottom = format!("{LEFT_PX:.1},{:.1}", HEIGHT_PX - BOTTOM_PX);
        let right_top = format!("{:.1},{TOP_PX:.1}", WIDTH_PX - RIGHT_PX);
        assert!(
            svg.contains(&format!(r#"points="{left_bottom} {right_top}""#)),
            "{svg}"
        );
        assert_eq!(escape(r#"'"&"#), "&#39;&quot;&amp;");
    }
}
