package main

// The reduced os library Argo CD gives health scripts: only os.time and os.date, so a script can
// read the clock but not exit, run commands or touch files. Registered as the "os" module (which
// keeps gopher-lua's full os table when the standard libraries were opened first, as in Argo CD)
// and preloaded for require("os"). Behaviour follows Argo CD's util/lua/oslib_safe.go.

import (
	"strconv"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
)

func safeOSFunctions() map[string]lua.LGFunction {
	return map[string]lua.LGFunction{"time": osTime, "date": osDate}
}

func openSafeOS(l *lua.LState) int {
	l.Push(l.RegisterModule(lua.OsLibName, safeOSFunctions()))
	return 1
}

func loadSafeOS(l *lua.LState) int {
	l.Push(l.SetFuncs(l.NewTable(), safeOSFunctions()))
	return 1
}

// os.time([t]): now, or the local time described by table t (hour defaults to 12).
func osTime(l *lua.LState) int {
	if l.GetTop() == 0 {
		l.Push(lua.LNumber(time.Now().Unix()))
		return 1
	}
	t := l.CheckTable(1)
	field := func(name string, fallback int) int {
		if n, ok := t.RawGetString(name).(lua.LNumber); ok {
			return int(n)
		}
		return fallback
	}
	at := time.Date(field("year", -1), time.Month(field("month", -1)), field("day", -1),
		field("hour", 12), field("min", 0), field("sec", 0), 0, time.Local)
	l.Push(lua.LNumber(at.Unix()))
	return 1
}

// os.date([format [, t]]): "!" first means UTC now; a second argument (Unix seconds, local)
// replaces the time; "*t" gives a table, anything else goes through strftime.
func osDate(l *lua.LState) int {
	now := time.Now()
	format := "%c"
	if l.GetTop() >= 1 {
		format = l.CheckString(1)
		if strings.HasPrefix(format, "!") {
			now = time.Now().UTC()
			format = strings.TrimLeft(format, "!")
		}
		if l.GetTop() >= 2 {
			now = time.Unix(l.CheckInt64(2), 0)
		}
		if strings.HasPrefix(format, "*t") {
			table := l.NewTable()
			for name, value := range map[string]int{
				"year": now.Year(), "month": int(now.Month()), "day": now.Day(),
				"hour": now.Hour(), "min": now.Minute(), "sec": now.Second(),
				"wday": int(now.Weekday()) + 1, "yday": 0,
			} {
				table.RawSetString(name, lua.LNumber(value))
			}
			table.RawSetString("isdst", lua.LFalse)
			l.Push(table)
			return 1
		}
	}
	l.Push(lua.LString(strftime(now, format)))
	return 1
}

// Go layouts for the strftime conversions the Argo CD os.date knows. %a maps to the Go text
// "mon", which is no layout element, so it prints literally "mon" there too.
var strftimeLayouts = map[byte]string{
	'a': "mon", 'A': "Monday", 'b': "Jan", 'B': "January", 'c': "02 Jan 06 15:04 MST",
	'd': "02", 'F': "2006-01-02", 'H': "15", 'I': "03", 'm': "01", 'M': "04", 'p': "PM",
	'P': "pm", 'S': "05", 'x': "15/04/05", 'X': "15:04:05", 'y': "06", 'Y': "2006",
	'z': "-0700", 'Z': "MST",
}

func strftime(t time.Time, format string) string {
	var out strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i == len(format)-1 {
			out.WriteByte(c)
			continue
		}
		i++
		switch spec := format[i]; {
		case spec == '%':
			out.WriteByte('%')
		case spec == 'w':
			out.WriteString(strconv.Itoa(int(t.Weekday())))
		case strftimeLayouts[spec] != "":
			out.WriteString(t.Format(strftimeLayouts[spec]))
		default:
			out.WriteByte('%')
			out.WriteByte(spec)
		}
	}
	return out.String()
}
