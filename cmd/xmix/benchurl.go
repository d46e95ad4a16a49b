package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// urlRun is one run of the online workload against a server.
type urlRun struct {
	latency
	Failed int `json:"failed"` // requests that got an error instead of a completion
	// CompletionTokens sums the usage the server reported.
	CompletionTokens int `json:"completion_tokens"`
}

type urlResult struct {
	Rate      float64  `json:"rate"`
	Requests  int      `json:"requests"`
	OutputLen int      `json:"output_len"`
	IgnoreEOS bool     `json:"ignore_eos"`
	Warmup    int      `json:"warmup_runs"`
	Runs      []urlRun `json:"runs"`
	Mean      urlRun   `json:"mean"`
	// Errors are the first few failures' messages.
	Errors []string `json:"errors,omitempty"`
}

// benchURL drives an OpenAI-compatible server with the online workload, streaming, and
// measures what its clients see.
func benchURL(w io.Writer, f benchFlags) error {
	if err := f.checkRate(); err != nil {
		return err
	}
	if err := f.checkAppFraction(); err != nil {
		return err
	}
	if err := f.checkCounts(); err != nil {
		return err
	}
	if f.apps != "" {
		return fmt.Errorf("--apps enables apps in-process; over HTTP give --xmix-apps")
	}
	base := strings.TrimSuffix(f.url, "/")
	if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
		return fmt.Errorf("--url %q: want http://HOST:PORT", f.url)
	}
	if f.vocab < 1 {
		return fmt.Errorf("--vocab %d: want at least 1", f.vocab)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: max(f.requests, 2), DisableCompression: true,
		ResponseHeaderTimeout: 0, IdleConnTimeout: time.Minute}}
	model, maxLen, err := remoteModel(hc, base, f.model)
	if err != nil {
		return err
	}
	if f.maxModelLen > 0 {
		maxLen = f.maxModelLen
	}
	if maxLen == 0 {
		return fmt.Errorf("%s/v1/models does not say the model's max_model_len: give --max-model-len", base)
	}
	var apps []string
	if f.xmixApps != "" {
		apps = strings.Split(f.xmixApps, ",")
	}
	work, err := onlineWorkload(f, apps, f.rngs(), maxLen, f.vocab)
	if err != nil {
		return err
	}
	f.progress("bench: %d requests to %s (model %s, max_model_len %d)", len(work), base, model, maxLen)
	res := urlResult{Rate: f.rate, Requests: f.requests, OutputLen: f.outputLen, IgnoreEOS: f.ignoreEOS, Warmup: f.warmup}
	for run := 0; run < f.warmup+f.runs; run++ {
		start := time.Now()
		ts := make([]timing, len(work))
		errs := make([]error, len(work))
		used := make([]int, len(work))
		var wg sync.WaitGroup
		for i, a := range work {
			if d := time.Until(start.Add(a.at)); d > 0 {
				time.Sleep(d)
			}
			body, err := completionBody(model, a, f)
			if err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ts[i].submitted, ts[i].prompt = time.Now(), len(a.req.Prompt)
				ts[i].tokens, used[i], errs[i] = streamCompletion(hc, base, body, a.req.MaxTokens)
			}()
		}
		wg.Wait()
		el := time.Since(start).Seconds()
		r := urlRun{latency: measure(ts, el)}
		for i, err := range errs {
			r.CompletionTokens += used[i]
			if err != nil {
				r.Failed++
				if len(res.Errors) < 5 {
					res.Errors = append(res.Errors, fmt.Sprintf("request %d: %v", i, err))
				}
			}
		}
		if r.Failed == len(work) {
			return fmt.Errorf("every request failed; the first: %s", res.Errors[0])
		}
		kind := "measured"
		if run < f.warmup {
			kind = "warm-up"
		} else {
			res.Runs = append(res.Runs, r)
		}
		f.progress("url run %d (%s): mean ITL %.3f ms, P50 %.3f ms, P99 %.3f ms, mean TTFT %.2f ms, %.0f tok/s, %d failed",
			run, kind, r.MeanITLms, r.P50ITLms, r.P99ITLms, r.MeanTTFTms, r.TokPerS, r.Failed)
	}
	var lats []latency
	for _, r := range res.Runs {
		lats = append(lats, r.latency)
		res.Mean.Failed += r.Failed
		res.Mean.CompletionTokens += r.CompletionTokens
	}
	res.Mean.latency = meanLatency(lats)
	if n := len(res.Runs); n > 0 {
		res.Mean.Failed, res.Mean.CompletionTokens = res.Mean.Failed/n, res.Mean.CompletionTokens/n
	}
	return writeResults(w, map[string]any{"url": base, "model": model, "apps": apps, "app_fraction": f.appFraction, "online": res})
}

// remoteModel asks the server's /v1/models for the model's id (want, when given, must be
// one of them) and its max_model_len (vLLM's field; 0 when absent).
func remoteModel(hc *http.Client, base, want string) (string, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/v1/models", nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", 0, fmt.Errorf("the server: %w", err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return "", 0, fmt.Errorf("GET %s/v1/models: %s: %s", base, resp.Status, data)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return "", 0, fmt.Errorf("GET %s/v1/models: %w", base, err)
	}
	var ids []string
	for _, m := range list.Data {
		if want == "" || m.ID == want {
			return m.ID, m.MaxModelLen, nil
		}
		ids = append(ids, m.ID)
	}
	if want == "" {
		return "", 0, fmt.Errorf("GET %s/v1/models lists no model", base)
	}
	return "", 0, fmt.Errorf("--model %q: the server serves %s", want, strings.Join(ids, ", "))
}

// completionBody is the streamed completion request for one arrival, as vLLM's bench sends
// it: token ids, greedy unless --temperature says otherwise, the usage at the end.
func completionBody(model string, a arrival, f benchFlags) ([]byte, error) {
	body := map[string]any{"model": model, "prompt": a.req.Prompt, "max_tokens": a.req.MaxTokens, "temperature": f.temperature,
		"top_p": f.topP, "stream": true, "stream_options": map[string]bool{"include_usage": true}}
	if f.ignoreEOS {
		body["ignore_eos"] = true
	}
	if len(a.req.Apps) > 0 {
		body["xmix"] = map[string]any{"apps": a.req.Apps}
	}
	return json.Marshal(body)
}

// streamCompletion posts one streamed completion and returns when each chunk with a choice
// arrived (the client's token times) and the completion tokens the usage reported.
func streamCompletion(hc *http.Client, base string, body []byte, maxTokens int) ([]time.Time, int, error) {
	resp, err := hc.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, 0, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(data))
	}
	times := make([]time.Time, 0, maxTokens)
	used := 0
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		now := time.Now()
		if data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data: ")); ok {
			if string(data) == "[DONE]" {
				return times, used, nil
			}
			var ch struct {
				Choices []json.RawMessage `json:"choices"`
				Usage   *struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
				Error *struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(data, &ch); err != nil {
				return times, used, fmt.Errorf("chunk %.100q: %w", data, err)
			}
			if ch.Error != nil {
				return times, used, errors.New(ch.Error.Message)
			}
			if len(ch.Choices) > 0 {
				times = append(times, now)
			}
			if ch.Usage != nil {
				used = ch.Usage.CompletionTokens
			}
		}
		if err != nil {
			if err == io.EOF {
				err = errors.New("the stream ended without data: [DONE]")
			}
			return times, used, err
		}
	}
}
