// What mq-stats writes to a terminal: text from brokers made harmless, and its width in columns.

/**
 * Raw topic and group names are arbitrary strings: never let one move the cursor, clear the screen,
 * or reorder what follows it. Control characters, invisible format characters (a right-to-left
 * override, a zero-width space), line and paragraph separators and lone surrogates are shown escaped.
 */
export function terminalSafe(value: string): string {
  return value.replace(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]/gu, (c) => {
    const code = c.codePointAt(0)!
    return code > 0xffff ? `\\u{${code.toString(16)}}` : `\\u${code.toString(16).padStart(4, '0')}`
  })
}

/**
 * Columns a string takes in a terminal, near enough for table alignment: combining marks take none,
 * East Asian wide and fullwidth characters and emoji two, the rest one. An emoji is a character
 * shown as one by default (😀, ✅), or a text symbol asked to be one by U+FE0F (❤️: two columns in
 * most terminals, one in some, such as VTE's); a skin-tone modifier joins the emoji before it,
 * and two regional indicators make one flag (🇩🇪).
 */
export function displayWidth(text: string): number {
  let width = 0
  let previous = ''
  let flagOpen = false
  for (const c of text) {
    const code = c.codePointAt(0)!
    if (c === '\uFE0F') {
      if (previous !== '' && displayWidth(previous) === 1 && /\p{Emoji}/u.test(previous)) width += 1
    } else if (/\p{M}/u.test(c)) {
      // takes no column of its own
    } else if (/\p{Emoji_Modifier}/u.test(c) && /\p{Emoji}/u.test(previous)) {
      // a skin tone of the emoji before it
    } else if (/\p{Regional_Indicator}/u.test(c)) {
      width += flagOpen ? 0 : 2
      flagOpen = !flagOpen
    } else {
      width += isWide(code) || /\p{Emoji_Presentation}/u.test(c) ? 2 : 1
    }
    if (!/\p{Regional_Indicator}/u.test(c)) flagOpen = false
    previous = c
  }
  return width
}

function isWide(code: number): boolean {
  return (
    (code >= 0x1100 && code <= 0x115f) || (code >= 0x2e80 && code <= 0xa4cf && code !== 0x303f) ||
    (code >= 0xac00 && code <= 0xd7a3) || (code >= 0xf900 && code <= 0xfaff) || (code >= 0xfe30 && code <= 0xfe4f) ||
    (code >= 0xff00 && code <= 0xff60) || (code >= 0xffe0 && code <= 0xffe6) || (code >= 0x1f300 && code <= 0x1f6ff) ||
    (code >= 0x1f900 && code <= 0x1faff) || (code >= 0x20000 && code <= 0x3fffd)
  )
}

/** A message on one line: an error's text may hold newlines (a JSON parse error quotes its input). */
export function oneLine(text: string): string {
  return text.replace(/\s+/g, ' ').trim()
}
