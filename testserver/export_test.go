package testserver

// MaxSaves is how often the Middleware tries one save.
const MaxSaves = maxSaves
