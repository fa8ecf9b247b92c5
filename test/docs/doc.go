// Package docs holds the docs test: docs/tutorial.md's shell blocks run as
// one script with a freshly built kiln, and what they print checked against
// the output the tutorial shows, so the tutorial stays true.
package docs
