// The import page: when the browser gives a picked file's folder (webkitRelativePath, set when a
// folder is picked or dropped), fill the run name with "folder/file" unless the user typed one.
(function () {
  "use strict";
  var name = document.getElementById("id_name");
  var input = document.getElementById("id_rollouts");
  if (!name || !input) return;
  var auto = "";
  name.addEventListener("input", function () { auto = null; });
  input.addEventListener("change", function () {
    if (auto === null && name.value) return;  // the user's own name stays
    var file = input.files && input.files[0];
    var path = file && file.webkitRelativePath;
    if (!path) return;
    var parts = path.split("/").filter(Boolean);
    var label = parts.slice(-2).join("/");
    if (input.files.length > 1) label += " + " + (input.files.length - 1) + " more file(s)";
    name.value = label.slice(0, 200);
    auto = name.value;
  });
})();
