package main

// The Lua environment Argo CD (v3.5, util/lua) runs a resource health script in, rebuilt on the
// same gopher-lua and gopher-json versions:
//
//   - a fresh LState per run; gopher-lua's standard libraries only when "open libs" is on (Argo CD
//     turns it on for its built-in scripts, and for argocd-cm scripts only with
//     resource.customizations.useOpenLibs.<group_kind> = "true");
//   - whatever that says, the package, base and table libraries are (re)opened, and a reduced os
//     library with only time and date is registered and preloaded for require("os");
//   - the run is bounded by a one-second context;
//   - globals: actionParams (an empty table for health scripts) and obj, the object as nested
//     tables (numbers as Lua numbers, json.Number as strings);
//   - the script's return value: a table is encoded to JSON by gopher-json and read as
//     {status, message}; an empty table or nil is an empty health; a status outside the six
//     known codes becomes Unknown; anything else is an error.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
)

// The health codes Argo CD accepts from a script (gitops-engine pkg/health).
var healthCodes = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true,
	"Suspended": true, "Missing": true, "Unknown": true,
}

// Health is what a script decided; the zero value is "no health" (Argo CD shows none).
type Health struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

// runHealthScript runs script on obj as Argo CD's ExecuteHealthLua does.
func runHealthScript(obj map[string]any, script string, openLibs bool) (Health, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: !openLibs})
	defer l.Close()
	libraries := []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOS},
	}
	for _, lib := range libraries {
		err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name))
		if err != nil {
			return Health{}, fmt.Errorf("opening the Lua %q library: %w", lib.name, err)
		}
	}
	l.PreloadModule(lua.OsLibName, loadSafeOS)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)

	l.SetGlobal("actionParams", l.CreateTable(0, 0))
	l.SetGlobal("obj", toLua(l, obj))

	fn, err := l.LoadString(script)
	if err == nil {
		l.Push(fn)
		err = l.PCall(0, lua.MultRet, nil)
	}
	if err != nil {
		// Argo CD drops the Lua stack trace of runtime errors: users see only the message.
		var apiErr *lua.ApiError
		if errors.As(err, &apiErr) && apiErr.Type == lua.ApiErrorRun {
			apiErr.StackTrace = ""
		}
		return Health{}, err
	}
	return readHealth(l.Get(-1))
}

func readHealth(value lua.LValue) (Health, error) {
	switch value.Type() {
	case lua.LTNil:
		return Health{}, nil
	case lua.LTTable:
	default:
		return Health{}, fmt.Errorf("expect table output from Lua script, not %s", value.Type())
	}
	encoded, err := luajson.Encode(value)
	if err != nil {
		return Health{}, err
	}
	var health Health
	if err := json.Unmarshal(encoded, &health); err != nil {
		// gopher-json writes an empty table as [], which Argo CD reads as an empty health; it
		// treats every other type mismatch (say, a numeric status) the same way.
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return Health{}, nil
		}
		return Health{}, err
	}
	if !healthCodes[health.Status] {
		return Health{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
	}
	return health, nil
}

// toLua converts a decoded object the way Argo CD hands it to scripts. Integer types appear
// because objects from the API server carry int64; unknown types become nil.
func toLua(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case json.Number:
		return lua.LString(string(v))
	case float64:
		return lua.LNumber(v)
	case int:
		return lua.LNumber(v)
	case int32:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case []any:
		array := l.CreateTable(len(v), 0)
		for _, item := range v {
			array.Append(toLua(l, item))
		}
		return array
	case map[string]any:
		table := l.CreateTable(0, len(v))
		for key, item := range v {
			table.RawSetH(lua.LString(key), toLua(l, item))
		}
		return table
	default:
		return lua.LNil
	}
}
