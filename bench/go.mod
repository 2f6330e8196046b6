module github.com/idemkit/idem/bench

go 1.25.0

require (
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
)

replace github.com/idemkit/idem => ../
