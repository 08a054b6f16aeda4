/**
 * Methods and capability types are names, not paths (as `reach/core/fleet/names.py` says): the
 * hub delivers to `{endpoint}/tasks/{method}`, so a method that could climb out of
 * `/tasks/` (`x/../../admin`) would reach any path on the agent's host. A name is letters,
 * digits and `. _ : -`, in parts joined by `/`, each part starting with a letter or digit.
 */

export const MAX_NAME = 128;
const PART = "[A-Za-z0-9][A-Za-z0-9._:-]*";
const NAME = new RegExp(`^${PART}(?:/${PART})*$`);
const ALLOWED = "letters, digits and . _ : -, in parts joined by /, each part starting with a letter or digit";

/** Why `value` is not a method name (or capability type), or null. */
export function nameRefusal(value: string, what = "method"): string | null {
  if (!value) return `${what} is empty`;
  if (value.length > MAX_NAME) return `${what} is longer than ${MAX_NAME} characters`;
  if (NAME.test(value)) return null;
  if (value.split("/").some((p) => p === "" || p === "." || p === "..")) {
    return (
      `${what} '${value}' is a path, not a name: a part that is empty, '.' or '..' ` +
      `would move the delivery off /tasks/ on the agent (${ALLOWED})`
    );
  }
  return `${what} '${value}' is not a name (${ALLOWED})`;
}
