// Package testutil holds what the tests of package weft and of package weft/trainer share.
package testutil

import (
	"fmt"
	"strings"

	"weft.dev/weft"
)

// WantStatus describes a problem unless err is a *weft.Error of status want whose message
// contains every fragment ("" when it is).
func WantStatus(what string, err error, want weft.Status, fragments ...string) string {
	if weft.StatusOf(err) != want {
		return fmt.Sprintf("%s: got error %v, want status %v", what, err, want)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			return fmt.Sprintf("%s: error %q does not mention %q", what, err, f)
		}
	}
	return ""
}
