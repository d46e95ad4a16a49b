package serve

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"xmix/loader"
)

// 64 streaming requests at once, mixing apps (with and without scalar overrides, with
// per-request vectors and layers) and plain rows, greedy and sampled: each streams exactly
// what it generates alone (the CPU backend's rows are independent of their batch), and
// afterwards no goroutine, sequence slot, KV page or vector slot is left behind.
func TestConcurrentStreamsEqualAlone(t *testing.T) {
	b := tinyPRBundle(t)
	ts := startServer(t, b, nil)
	tr := &http.Transport{}
	hc := &http.Client{Transport: tr}
	// The baseline: the server up and a connection used and closed.
	if resp, err := hc.Get(ts.url + "/health"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	tr.CloseIdleConnections()
	time.Sleep(50 * time.Millisecond)
	baseline := runtime.NumGoroutine()

	prompts := []string{"Once upon a time", "Tom was sad.", "The old man", "A cat sat", "Lily found a box"}
	v := make([]float32, 256)
	for i := range v {
		v[i] = float32(math.Sin(float64(7 * i)))
	}
	list, _ := json.Marshal(v)
	mixes := []struct {
		xmix   string
		apps   []string
		set    map[string]float32
		vecs   map[string][]float32
		layers map[string][]int
	}{
		{"", nil, nil, nil, nil},
		{`, "xmix": {"apps": ["tiny-steer"]}`, []string{"tiny-steer"}, nil, nil, nil},
		{`, "xmix": {"apps": ["tiny-probe"]}`, []string{"tiny-probe"}, nil, nil, nil},
		{`, "xmix": {"apps": ["tiny-steer", "tiny-probe"], "set": {"tiny-steer.op0.alpha": -12}}`, []string{"tiny-steer", "tiny-probe"}, map[string]float32{"tiny-steer.op0.alpha": -12}, nil, nil},
		{`, "xmix": {"apps": ["tiny-pr", "tiny-probe"], "vectors": {"tiny-pr.happy": ` + string(list) + `}}`, []string{"tiny-probe", "tiny-pr"}, nil, map[string][]float32{"tiny-pr.happy": v}, nil},
		{`, "xmix": {"apps": ["tiny-pr"]}`, []string{"tiny-pr"}, nil, nil, nil},
		{`, "xmix": {"apps": ["tiny-pr"], "layers": {"tiny-pr.op0": [2]}, "vectors": {"tiny-pr.happy": ` + string(list) + `}}`, []string{"tiny-pr"}, nil, map[string][]float32{"tiny-pr.happy": v}, map[string][]int{"tiny-pr.op0": {2}}},
	}
	type req struct {
		body string
		want loader.Request
	}
	var reqs []req
	for i := range 64 {
		p, m := prompts[i%len(prompts)], mixes[i%len(mixes)]
		n := 4 + (i*5)%13
		r := loader.Request{Prompt: ts.tok.Encode(p), MaxTokens: n, TopP: 1, Apps: m.apps, Overrides: m.set, Vectors: m.vecs, Layers: m.layers}
		sampling := `"temperature": 0`
		if i%3 == 2 {
			r.Temperature, r.TopP, r.Seed = 0.9, 0.95, uint64(i)
			sampling = fmt.Sprintf(`"temperature": 0.9, "top_p": 0.95, "seed": %d`, i)
		}
		reqs = append(reqs, req{fmt.Sprintf(`{"prompt": %q, "max_tokens": %d, %s, "stream": true, "stream_options": {"include_usage": true}%s}`, p, n, sampling, m.xmix), r})
	}
	var wantReqs []loader.Request
	for _, r := range reqs {
		wantReqs = append(wantReqs, r.want)
	}
	want := alone(t, b, wantReqs...)
	got := make([]streamed, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := hc.Post(ts.url+"/v1/completions", "application/json", strings.NewReader(r.body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			got[i] = readStream(t, resp.Body)
		}()
	}
	wg.Wait()
	for i, w := range want {
		g := got[i]
		if !g.done || g.usage == nil {
			t.Errorf("request %d: an unfinished stream %+v", i, g)
			continue
		}
		checkAgainst(t, fmt.Sprint("request ", i), ts.tok, w, g.text, g.finish, g.usage.CompletionTokens, g.exports, reqs[i].want.Apps)
	}
	ts.waitIdle(t)
	tr.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > baseline {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines, %d before:\n%s", n, baseline, buf[:runtime.Stack(buf, true)])
	}
}
