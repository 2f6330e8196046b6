package testserver

// MaxSaves is how often the Middleware tries one save.
const MaxSaves = maxSaves

// MaxAhead is how many claims ahead of its clock a Middleware remembers.
const MaxAhead = maxAhead
