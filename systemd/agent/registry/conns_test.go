package registry

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// TestConnLimit: the registry holds at most maxConns connections (2 here).
// Idle keep-alive connections make room for a new one; two clients that
// asked for a blob and read nothing make a third wait until one of them
// leaves, and it is served then.
func TestConnLimit(t *testing.T) {
	dir, layer := bigImage(t, 16<<20)
	log, _ := testLogger()
	s := must(New([]string{dir}, WithLogger(log)))
	s.maxConns = 2
	base := "http://" + serve(t, s)
	client := func() *http.Client { return &http.Client{Transport: &http.Transport{}} }
	ping := func(c *http.Client) error {
		resp, err := c.Get(base + "/v2/")
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}

	// Two connections left idle, then a third client: one idle is closed for it.
	idle1, idle2, third := client(), client(), client()
	for _, c := range []*http.Client{idle1, idle2} {
		if err := ping(c); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- ping(third) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a third client beside two idle connections: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a third client waited although the other two connections were idle")
	}
	idle1.CloseIdleConnections()
	idle2.CloseIdleConnections()
	third.CloseIdleConnections()

	// Two readers that read nothing hold both connections.
	var held []*http.Response
	for i := 0; i < 2; i++ {
		resp, err := client().Get(base + "/v2/quay.io/acme/big/blobs/" + layer.String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, resp)
	}
	go func() { done <- ping(client()) }()
	select {
	case err := <-done:
		t.Fatalf("a third connection was served while two were held (%v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	held[0].Body.Close() // one leaves
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiting client, once a reader left: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting client was not served once a reader left")
	}
	held[1].Body.Close()
}
