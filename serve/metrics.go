package serve

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"xmix/bundle"
	"xmix/loader"
)

// metrics are what GET /metrics reports, in Prometheus' format.
type metrics struct {
	requests         *prometheus.CounterVec // endpoint, outcome, code
	aborted          prometheus.Counter
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	ttft, itl, e2e   prometheus.Histogram
	running          prometheus.Gauge
	// waiting is read when scraped, so a reply the loop sent before its next observeLoad
	// (a request the engine refused) is never counted as still waiting.
	waiting     prometheus.GaugeFunc
	kvUsage     prometheus.Gauge
	vectorSlots prometheus.Gauge
	step        *prometheus.HistogramVec // bucket
	appRequests *prometheus.CounterVec   // app
	fired       *prometheus.CounterVec   // op
	// bucketName names a template by its kind and rows.
	bucketName map[[2]int]string
}

// newMetrics registers the metrics on reg; waiting counts the requests without a slot.
func newMetrics(reg *prometheus.Registry, b *bundle.Bundle, waiting func() float64) (*metrics, error) {
	latency := []float64{.001, .0025, .005, .01, .02, .04, .06, .08, .1, .15, .2, .3, .5, .75, 1, 2.5, 5, 10, 20, 40, 80}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xmix_requests_total",
			Help: "Requests by endpoint and outcome (stop, length, timeout, cancelled: the client left, error) and HTTP status."},
			[]string{"endpoint", "outcome", "code"}),
		aborted: prometheus.NewCounter(prometheus.CounterOpts{Name: "xmix_requests_aborted_total",
			Help: "Requests the engine dropped before they finished: their client left, a stop string matched, or they timed out."}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "xmix_prompt_tokens_total",
			Help: "Prompt tokens of the requests that ran (BOS included)."}),
		generationTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "xmix_generation_tokens_total",
			Help: "Generated tokens returned to clients."}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "xmix_time_to_first_token_seconds",
			Help: "From a request's arrival to its first generated token.", Buckets: latency}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "xmix_inter_token_latency_seconds",
			Help: "Between consecutive generated tokens of a request.", Buckets: latency}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "xmix_e2e_request_latency_seconds",
			Help: "From a request's arrival to its response's end.", Buckets: latency}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "xmix_requests_running",
			Help: "Requests holding a sequence slot."}),
		waiting: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "xmix_requests_waiting",
			Help: "Requests waiting for a slot or KV pages."}, waiting),
		kvUsage: prometheus.NewGauge(prometheus.GaugeOpts{Name: "xmix_kv_cache_usage_ratio",
			Help: "Share of the KV-cache pages held by requests (0-1)."}),
		vectorSlots: prometheus.NewGauge(prometheus.GaugeOpts{Name: "xmix_vector_slots_used",
			Help: "Per-request vector slots held by requests (xmix.vectors)."}),
		step: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "xmix_step_duration_seconds",
			Help: "Engine step time by template (batch bucket).", Buckets: latency}, []string{"bucket"}),
		appRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xmix_app_enabled_requests_total",
			Help: "Requests that enabled each app."}, []string{"app"}),
		fired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xmix_app_fired_sites_total",
			Help: "(token, layer) sites where each op (app.opN) changed or read a request's rows."}, []string{"op"}),
		bucketName: map[[2]int]string{},
	}
	for _, c := range []prometheus.Collector{m.requests, m.aborted, m.promptTokens, m.generationTokens, m.ttft, m.itl, m.e2e,
		m.running, m.waiting, m.kvUsage, m.vectorSlots, m.step, m.appRequests, m.fired} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	for _, t := range b.Templates {
		m.bucketName[[2]int{kindIndex(t.Kind), t.Tokens}] = t.Name
	}
	for _, a := range b.Manifest.Apps {
		m.appRequests.WithLabelValues(a.Name) // every app is listed, at 0 until used
	}
	return m, nil
}

func kindIndex(kind bundle.TemplateKind) int {
	if kind == bundle.Decode {
		return 0
	}
	return 1
}

func (m *metrics) handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

func (m *metrics) enabled(apps []string) {
	for _, a := range apps {
		m.appRequests.WithLabelValues(a).Inc()
	}
}

// observeStep times a step by its template, found from what the engine counted in it.
func (sv *Server) observeStep(before, after loader.Stats, d time.Duration) {
	kind := 1
	if after.DecodeSteps > before.DecodeSteps {
		kind = 0
	}
	rows := after.Rows + after.PaddedRows - before.Rows - before.PaddedRows
	name, ok := sv.metrics.bucketName[[2]int{kind, rows}]
	if !ok {
		name = fmt.Sprintf("%d_rows", rows)
	}
	sv.metrics.step.WithLabelValues(name).Observe(d.Seconds())
}

// observeLoad publishes the engine's load after a step: the gauges, and the queue that
// --max-queue bounds.
func (sv *Server) observeLoad(l loader.Load) {
	sv.queued.Store(int64(l.Queued))
	sv.metrics.running.Set(float64(l.Running))
	if l.Pages > 0 {
		sv.metrics.kvUsage.Set(1 - float64(l.FreePages)/float64(l.Pages))
	}
	sv.metrics.vectorSlots.Set(float64(l.VectorSlots - l.FreeVectorSlots))
}

// record counts a finished request and writes its log line.
func (sv *Server) record(r *http.Request, c *call, status int) {
	m := sv.metrics
	endpoint := r.URL.Path
	el := time.Since(c.start)
	outcome := c.outcome
	if status >= 400 {
		outcome = "error"
	}
	m.requests.WithLabelValues(endpoint, outcome, fmt.Sprint(status)).Inc()
	var v view
	if c.j != nil {
		v = c.j.view()
		m.promptTokens.Add(float64(v.promptLen))
		m.generationTokens.Add(float64(c.n))
		times := v.times[:min(c.n, len(v.times))]
		if len(times) > 0 {
			m.ttft.Observe(times[0].Sub(c.start).Seconds())
		}
		for k := 1; k < len(times); k++ {
			m.itl.Observe(times[k].Sub(times[k-1]).Seconds())
		}
		m.e2e.Observe(el.Seconds())
		for _, f := range v.fired {
			m.fired.WithLabelValues(f.Name).Add(float64(f.Sites))
		}
	}
	if w := sv.cfg.RequestLog; w != nil {
		sv.logLine(w, r, c, v, status, el)
	}
}

func (sv *Server) logLine(w io.Writer, r *http.Request, c *call, v view, status int, el time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s %d", c.start.UTC().Format(time.RFC3339Nano), r.Method, r.URL.Path, status)
	if c.id != "" {
		fmt.Fprintf(&b, " id=%s", c.id)
	}
	outcome := c.outcome
	if status >= 400 {
		outcome = "error"
	}
	fmt.Fprintf(&b, " outcome=%s", outcome)
	if c.j != nil {
		fmt.Fprintf(&b, " prompt_tokens=%d completion_tokens=%d", v.promptLen, c.n)
		if c.gr != nil {
			fmt.Fprintf(&b, " stream=%v", c.gr.stream)
		}
		if len(c.p.apps) > 0 {
			fmt.Fprintf(&b, " apps=%s", strings.Join(c.p.apps, ","))
		}
		if c.n > 0 && len(v.times) > 0 {
			fmt.Fprintf(&b, " ttft_ms=%.1f", v.times[0].Sub(c.start).Seconds()*1000)
		}
	}
	fmt.Fprintf(&b, " ms=%.1f remote=%s\n", el.Seconds()*1000, r.RemoteAddr)
	sv.logMu.Lock()
	io.WriteString(w, b.String())
	sv.logMu.Unlock()
}
